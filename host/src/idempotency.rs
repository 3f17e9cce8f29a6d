//! Deriving a message's idempotency key from a header, a subject token or a JSON pointer.

use async_nats::HeaderMap;
use thiserror::Error;

use crate::config::KeySource;

/// Why a message has no usable key.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum MissingKey {
    /// The header is absent or empty.
    #[error("no idempotency key: header `{0}` is missing or empty")]
    Header(String),
    /// The subject has too few tokens.
    #[error("no idempotency key: subject `{subject}` has no token {index}")]
    SubjectToken {
        /// The subject.
        subject: String,
        /// The token index.
        index: usize,
    },
    /// The payload is not JSON, or the pointer finds nothing usable.
    #[error("no idempotency key: {0}")]
    JsonPointer(String),
}

/// The header publishers deduplicate with, and the default key source.
pub const MSG_ID: &str = "Nats-Msg-Id";

/// Set by `dedup-host dead-letters replay`: the replayed message's first `Nats-Msg-Id`, used
/// as its key instead of the replay's own message id, so the replay runs the same key.
/// Anyone who can publish can set it, so it is honoured only on a message proven to be the
/// replay of a dead letter (`crate::pipeline::replayed`), never by [`derive`].
pub const REPLAYED_MSG_ID: &str = "Dedup-Replayed-Msg-Id";

/// The start of a replay's own `Nats-Msg-Id`: `replay:<dead letter sequence>`.
pub const REPLAY_ID_PREFIX: &str = "replay:";

/// What a message claims to be the replay of: the key it asks for (its
/// [`REPLAYED_MSG_ID`]) and the dead letter's sequence (from its `replay:<n>` message id),
/// when `source` reads the message id and the message carries both. A claim, not a proof.
pub fn replay_claim<'a>(
    source: &KeySource,
    headers: Option<&'a HeaderMap>,
) -> Option<(&'a str, u64)> {
    let KeySource::Header(name) = source else {
        return None;
    };
    if !name.eq_ignore_ascii_case(MSG_ID) {
        return None;
    }
    let headers = headers?;
    let key = headers.get(REPLAYED_MSG_ID)?.as_str().trim();
    let letter = headers
        .get(MSG_ID)?
        .as_str()
        .strip_prefix(REPLAY_ID_PREFIX)?
        .parse()
        .ok()?;
    (!key.is_empty()).then_some((key, letter))
}

/// The key of a message according to `source`, from the message alone: a
/// [`REPLAYED_MSG_ID`] header is not honoured (see [`derive_replayed`]).
pub fn derive(
    source: &KeySource,
    subject: &str,
    headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Result<String, MissingKey> {
    match source {
        KeySource::Header(name) => headers
            .and_then(|h| h.get(name.as_str()))
            .map(|v| v.as_str().trim().to_string())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| MissingKey::Header(name.clone())),
        KeySource::SubjectToken(index) => {
            subject
                .split('.')
                .nth(*index)
                .map(str::to_string)
                .ok_or(MissingKey::SubjectToken {
                    subject: subject.to_string(),
                    index: *index,
                })
        }
        KeySource::JsonPointer(pointer) => {
            let value: serde_json::Value = serde_json::from_slice(payload).map_err(|e| {
                MissingKey::JsonPointer(format!(
                    "payload is not JSON ({e}), so `{pointer}` cannot be read"
                ))
            })?;
            match value.pointer(pointer) {
                Some(serde_json::Value::String(s)) if !s.is_empty() => Ok(s.clone()),
                Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => {
                    Ok(v.to_string())
                }
                Some(other) => Err(MissingKey::JsonPointer(format!(
                    "`{pointer}` is {other}, not a string or number"
                ))),
                None => Err(MissingKey::JsonPointer(format!(
                    "`{pointer}` is not in the payload"
                ))),
            }
        }
    }
}

/// [`derive`], except that a message keyed by its message id that carries a
/// [`REPLAYED_MSG_ID`] is keyed by it: for a message proven to be a dead letter's replay, and
/// for reports that show where a replay's key came from.
pub fn derive_replayed(
    source: &KeySource,
    subject: &str,
    headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Result<String, MissingKey> {
    match replay_claim(source, headers) {
        Some((key, _)) => Ok(key.to_string()),
        None => derive(source, subject, headers, payload),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_from_each_source() {
        let mut h = HeaderMap::new();
        h.insert("Nats-Msg-Id", "m1");
        assert_eq!(
            derive(&KeySource::default(), "a", Some(&h), b""),
            Ok("m1".into())
        );
        assert!(derive(&KeySource::default(), "a", None, b"").is_err());
        assert_eq!(
            derive(&KeySource::SubjectToken(1), "orders.42.new", None, b""),
            Ok("42".into())
        );
        assert!(derive(&KeySource::SubjectToken(5), "orders.42", None, b"").is_err());
        let ptr = KeySource::JsonPointer("/tx/id".into());
        assert_eq!(
            derive(&ptr, "a", None, br#"{"tx":{"id":"t-1"}}"#),
            Ok("t-1".into())
        );
        assert_eq!(
            derive(&ptr, "a", None, br#"{"tx":{"id":7}}"#),
            Ok("7".into())
        );
        assert!(derive(&ptr, "a", None, b"nope").is_err());
        assert!(derive(&ptr, "a", None, br#"{"tx":{}}"#).is_err());
    }

    #[test]
    fn a_replayed_id_is_honoured_only_when_asked() {
        let mut h = HeaderMap::new();
        h.insert(MSG_ID, "replay:7");
        h.insert(REPLAYED_MSG_ID, "victim");
        let source = KeySource::default();
        assert_eq!(derive(&source, "a", Some(&h), b""), Ok("replay:7".into()));
        assert_eq!(replay_claim(&source, Some(&h)), Some(("victim", 7)));
        assert_eq!(
            derive_replayed(&source, "a", Some(&h), b""),
            Ok("victim".into())
        );
        h.insert(MSG_ID, "m1");
        assert_eq!(replay_claim(&source, Some(&h)), None, "not a replay's id");
        assert_eq!(
            derive_replayed(&source, "a", Some(&h), b""),
            Ok("m1".into())
        );
    }
}
