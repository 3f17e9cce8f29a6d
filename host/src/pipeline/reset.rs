//! Whether a message's [`RESET_REVISION`] header is honoured (DESIGN rule 22).
//!
//! The header tells a host that the key was reset at that revision before the message was
//! published, so a read of the key below it comes from a lagging replica and is read again.
//! Only `dedup-host dead-letters replay` sets it, and anyone who may publish on a source
//! subject could forge it: it counts only on a message the dead-letter stream proves a replay
//! of the very key it runs under ([`replayed::proven`]); on any other message it is ignored.

use super::message::Delivery;
use super::replayed::{self, ProofUnavailable};
use super::Shared;
use crate::claim::record::RESET_REVISION;
use crate::claim::ClaimStore;
use crate::idempotency;
use crate::routes::Route;

impl<S: ClaimStore> Shared<S> {
    /// Records on `d` the revision its replay reset `key` at, when it carries one and the
    /// dead-letter stream proves it the replay of `key`; any other reset header is ignored.
    pub(super) async fn prove_reset(
        &self,
        d: &Delivery,
        route: &Route,
        key: &str,
    ) -> Result<(), ProofUnavailable> {
        let m = &d.message;
        let Some(revision) = claimed_revision(m.headers.as_ref()) else {
            return Ok(());
        };
        let proven = match idempotency::replay_claim(&route.key, m.headers.as_ref()) {
            Some(claim) if claim.0 == key => {
                let stream = &self.config.dead_letter.stream;
                replayed::proven(&self.js, stream, claim, &m.subject, &m.payload).await?
            }
            _ => false,
        };
        if proven {
            d.reset_at(revision);
        } else {
            tracing::warn!(
                route = route.name,
                sequence = d.sequence,
                "`{RESET_REVISION}` on a message that is not a proven replay of key `{}`: ignored",
                key.escape_debug()
            );
        }
        Ok(())
    }
}

/// The revision a message's single [`RESET_REVISION`] header names, if it names one.
fn claimed_revision(headers: Option<&async_nats::HeaderMap>) -> Option<u64> {
    let mut values = headers?.get_all(RESET_REVISION);
    let (Some(value), None) = (values.next(), values.next()) else {
        return None;
    };
    value.as_str().trim().parse().ok().filter(|r| *r > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_positive_revision_is_claimed() {
        let mut h = async_nats::HeaderMap::new();
        assert_eq!(claimed_revision(Some(&h)), None);
        h.insert(RESET_REVISION, "7");
        assert_eq!(claimed_revision(Some(&h)), Some(7));
        h.append(RESET_REVISION, "8");
        assert_eq!(claimed_revision(Some(&h)), None, "two values");
        let mut zero = async_nats::HeaderMap::new();
        zero.insert(RESET_REVISION, "0");
        assert_eq!(claimed_revision(Some(&zero)), None);
        assert_eq!(claimed_revision(None), None);
    }
}
