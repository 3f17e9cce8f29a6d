//! Whether a message that asks to run under another message's key (its
//! [`REPLAYED_MSG_ID`](crate::idempotency::REPLAYED_MSG_ID) header) really is the replay of a
//! dead letter (DESIGN rule 22).
//!
//! Anyone who may publish on a source subject can set that header, so it is checked against
//! where a replay comes from: the dead-letter stream, which only hosts write. The message's
//! own id `replay:<n>` names letter `n`; the letter must record the asked-for key as its claim
//! key (`Dedup-Claim-Key`, which the host sets over whatever the original carried), on the
//! message's subject, with the message's payload (or, cut, its start and whole size). A
//! message that passes is the letter's content on the letter's subject: running it under the
//! letter's key is what a replay does, whoever published it. Any other message is keyed by
//! its own `Nats-Msg-Id`, so it can never take another message's key.

use async_nats::jetstream::stream::RawMessageErrorKind;
use async_nats::jetstream::ErrorCode;
use async_nats::HeaderMap;
use thiserror::Error;

use super::effects::headers;
use super::message::Delivery;
use super::Shared;
use crate::claim::ClaimStore;
use crate::idempotency::{self, MissingKey};
use crate::routes::Route;

/// The dead-letter stream could not be read: the proof is unknown for now, try again later.
#[derive(Debug, Error)]
#[error("cannot read dead letter {letter} of stream `{stream}` to check a replayed message ({reason}); it is retried")]
pub struct ProofUnavailable {
    /// The dead-letter stream.
    pub stream: String,
    /// The letter's sequence.
    pub letter: u64,
    /// What failed.
    pub reason: String,
}

impl<S: ClaimStore> Shared<S> {
    /// The idempotency key of a delivery of `route`: a replay's first message id when the
    /// dead-letter stream proves it a replay, else derived from the message alone.
    pub(super) async fn derive_key(
        &self,
        d: &Delivery,
        route: &Route,
    ) -> Result<Result<String, MissingKey>, ProofUnavailable> {
        let m = &d.message;
        if let Some(claim) = idempotency::replay_claim(&route.key, m.headers.as_ref()) {
            let stream = &self.config.dead_letter.stream;
            if proven(&self.js, stream, claim, &m.subject, &m.payload).await? {
                return Ok(Ok(claim.0.to_string()));
            }
            // A replay redelivered after its letter was purged proves nothing any more, and
            // under its own id `replay:<n>` it would run a second time. When the key it names
            // is completed, answering under that key only acks this message as a duplicate
            // (harmless even for a forgery: the key ran already, and stays completed).
            if let Ok(Some((record, _))) = self.claimer.store().get(&route.claim_key(claim.0)).await
            {
                if record.state == crate::claim::ClaimState::Completed {
                    return Ok(Ok(claim.0.to_string()));
                }
            }
            tracing::warn!(
                route = route.name,
                sequence = d.sequence,
                "`{}` names key `{}` and dead letter {}, which does not prove it a replay: keyed by its own message id",
                idempotency::REPLAYED_MSG_ID,
                claim.0.escape_debug(),
                claim.1
            );
        }
        Ok(idempotency::derive(
            &route.key,
            &m.subject,
            m.headers.as_ref(),
            &m.payload,
        ))
    }
}

/// The key a message runs under outside a delivery (the poison-message path, `audit`,
/// `story`): a replay's first message id when dead letter `n` of `dead_letters` proves the
/// message its replay, else derived from the message alone (as [`Shared::derive_key`]).
pub async fn key_of(
    js: &async_nats::jetstream::Context,
    dead_letters: &str,
    source: &crate::config::KeySource,
    subject: &str,
    headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Result<Result<String, MissingKey>, ProofUnavailable> {
    if let Some(claim) = idempotency::replay_claim(source, headers) {
        if proven(js, dead_letters, claim, subject, payload).await? {
            return Ok(Ok(claim.0.to_string()));
        }
    }
    Ok(idempotency::derive(source, subject, headers, payload))
}

/// Whether dead letter `letter` of `stream` proves that the message (`subject`, `payload`)
/// is its replay under `key`. A letter that does not exist proves nothing.
pub async fn proven(
    js: &async_nats::jetstream::Context,
    stream: &str,
    (key, letter): (&str, u64),
    subject: &str,
    payload: &[u8],
) -> Result<bool, ProofUnavailable> {
    let unavailable = |reason: String| ProofUnavailable {
        stream: stream.to_string(),
        letter,
        reason,
    };
    let dead = js
        .get_stream_no_info(stream)
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    // Read from the stream's leader, not a replica that may lag the letter.
    match dead.get_raw_message(letter).await {
        Ok(m) => Ok(proves(&m.headers, &m.payload, (key, subject, payload))),
        Err(e) => match e.kind() {
            RawMessageErrorKind::NoMessageFound => Ok(false),
            RawMessageErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND => {
                Ok(false)
            }
            _ => Err(unavailable(e.to_string())),
        },
    }
}

/// Whether a letter with these headers and payload proves the replay of `key` on `subject`
/// with `payload`.
pub fn proves(
    letter: &HeaderMap,
    stored: &[u8],
    (key, subject, payload): (&str, &str, &[u8]),
) -> bool {
    let one = |name: &str| {
        let mut values = letter.get_all(name).map(|v| v.as_str());
        match (values.next(), values.next()) {
            (Some(v), None) => Some(v),
            _ => None,
        }
    };
    let (Some(route), Some(claim_key), Some(original)) = (
        one(headers::ROUTE),
        one(headers::CLAIM_KEY),
        one(headers::SUBJECT),
    ) else {
        return false;
    };
    if route.is_empty() || claim_key != crate::claim::key::encode(route, key) || original != subject
    {
        return false;
    }
    match letter.get(headers::TRUNCATED) {
        None => stored == payload,
        Some(size) => size.as_str().parse() == Ok(payload.len()) && payload.starts_with(stored),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letter(route: &str, key: &str, subject: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(headers::ROUTE, route);
        h.insert(
            headers::CLAIM_KEY,
            crate::claim::key::encode(route, key).as_str(),
        );
        h.insert(headers::SUBJECT, subject);
        h
    }

    #[test]
    fn only_the_letters_own_key_subject_and_payload_pass() {
        let h = letter("r", "k1", "in.a.b");
        assert!(proves(&h, b"p", ("k1", "in.a.b", b"p")));
        assert!(!proves(&h, b"p", ("victim", "in.a.b", b"p")), "another key");
        assert!(!proves(&h, b"p", ("k1", "in.a.c", b"p")), "another subject");
        assert!(!proves(&h, b"p", ("k1", "in.a.b", b"q")), "another payload");
        let mut cut = h.clone();
        cut.insert(headers::TRUNCATED, "4");
        assert!(proves(&cut, b"pa", ("k1", "in.a.b", b"pays")));
        assert!(
            !proves(&cut, b"pa", ("k1", "in.a.b", b"pay")),
            "another size"
        );
        let mut twice = h.clone();
        twice.append(headers::CLAIM_KEY, "r.victim");
        assert!(
            !proves(&twice, b"p", ("k1", "in.a.b", b"p")),
            "two claim keys"
        );
        assert!(!proves(&HeaderMap::new(), b"p", ("k1", "in.a.b", b"p")));
    }
}
