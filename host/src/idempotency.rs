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
pub const REPLAYED_MSG_ID: &str = "Dedup-Replayed-Msg-Id";

/// The key of a message according to `source`.
pub fn derive(
    source: &KeySource,
    subject: &str,
    headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Result<String, MissingKey> {
    match source {
        // A replayed dead letter carries its first message id, which stays its key.
        KeySource::Header(name) if name.eq_ignore_ascii_case(MSG_ID) => headers
            .and_then(|h| h.get(REPLAYED_MSG_ID).or_else(|| h.get(MSG_ID)))
            .map(|v| v.as_str().trim().to_string())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| MissingKey::Header(name.clone())),
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
}
