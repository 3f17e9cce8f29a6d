//! What happens to a message the server gave up delivering (its consumer's
//! `server_max_deliver` was reached), from its key's claim record: a settled key's message was
//! only a duplicate (drop it; a key coalesced under the message or a later one of its key is
//! settled for it, since its entity's newer message runs), a key still running under a live lease waits (its owner may
//! finish it, and the letter would then be wrong), anything else is dead-lettered and its key
//! recorded as failed for good. The host's undeliverable-message handler
//! (`host/src/pipeline/undeliverable.rs`, advisories and the marker sweep) and the simulation's
//! both decide here; how the message is read, lettered and dropped is theirs.

use std::time::Duration;

use crate::claim::{ClaimRecord, ClaimState};

/// What to do with a message the server gave up on, from its key's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GivenUp {
    /// The key is completed (not coalesced, or coalesced under this message or a later one
    /// of its key) or failed for good: the message was a duplicate; nothing to letter (an
    /// exclusive route's queued copy is deleted).
    Settled,
    /// The key is in progress under `owner`'s live lease: retried later, once that ends.
    Running {
        /// The host instance holding the lease.
        owner: String,
    },
    /// Dead-letter it (with the key's attempts and last failure, if it has a record), then
    /// record the key failed for good ([`failed_for_good`]).
    Letter {
        /// The attempts the key's record counts (0 without a record).
        attempt: u32,
        /// The key's last failure, if its record names one.
        last_reason: Option<String>,
    },
}

/// What to do with the message at source sequence `message` the server gave up on, whose
/// key's record is `record` (none: the key was never claimed), at `now_ms` with the claims'
/// clock skew margin `skew`.
pub fn decide(
    record: Option<&ClaimRecord>,
    message: Option<u64>,
    now_ms: u64,
    skew: Duration,
) -> GivenUp {
    let Some(record) = record else {
        return GivenUp::Letter {
            attempt: 0,
            last_reason: None,
        };
    };
    match record.state {
        // Coalesced under this very message, or a later one of its key: skipped for a newer
        // message of its entity that runs, or ran (a claim of it counts as a duplicate:
        // `Claimer::claim_message`). Lettered, its replay would run an older update over
        // that newer one. No test-only switch: the simulation excuses any letter of a message
        // the server gave up on, so no seed fails without it (40,000 seeds in every mode);
        // its test is the unit test below.
        ClaimState::Completed if record.is_coalesced() && coalesced_for(record, message) => {
            GivenUp::Settled
        }
        // Any other coalesced key is completed without having run: the entity's newest
        // message must still run it, and this may be that message (its claims refused by a
        // leader election until the server gave up: the simulation's seed 3153 `--coalesce`).
        // Dropped, the key would never run and nothing would say so; lettered, the operator's
        // replay runs it. No test-only switch since partitions never give a queued message
        // up (a source message given up before it was queued, or a queued one left by an
        // earlier version, can still meet this): no simulation seed reaches it, and its test
        // is the unit test below.
        ClaimState::Completed if record.is_coalesced() => GivenUp::Letter {
            attempt: record.attempt,
            last_reason: record.reason.clone(),
        },
        ClaimState::Completed => GivenUp::Settled,
        ClaimState::Failed if record.permanent => GivenUp::Settled,
        ClaimState::InProgress if !record.lease_lapsed(now_ms, skew) => GivenUp::Running {
            owner: record.owner.clone(),
        },
        _ => GivenUp::Letter {
            attempt: record.attempt,
            last_reason: record.reason.clone(),
        },
    }
}

/// Whether coalesced `record` names the message at source sequence `message` or a later one
/// of its key.
fn coalesced_for(record: &ClaimRecord, message: Option<u64>) -> bool {
    matches!((message, record.source_sequence), (Some(ours), Some(named)) if ours <= named)
}

/// The dead letter's reason for a message the server delivered `deliveries` times, with the
/// key's last failure `last` if its record names one.
pub fn reason(deliveries: u64, last: Option<&str>) -> String {
    match last {
        Some(last) => format!("the server gave up after {deliveries} deliveries; the last attempt: {last}"),
        None => format!("the server gave up after {deliveries} deliveries: the host could not take the message (headers it cannot parse, an outage that outlasted every retry, or a key that stayed busy)"),
    }
}

/// `record` once its message's letter is stored: failed for good with `reason`, so that
/// `inspect`, `audit` and every later delivery of the key see what the dead letter says.
pub fn failed_for_good(record: &mut ClaimRecord, reason: String, now_ms: u64) {
    record.state = ClaimState::Failed;
    record.permanent = true;
    record.retry_at_ms = None;
    record.reason = Some(reason);
    record.updated_ms = now_ms;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(state: ClaimState, permanent: bool, lease_expires_ms: u64) -> ClaimRecord {
        ClaimRecord {
            lease_expires_ms,
            reason: Some("boom".into()),
            retry_at_ms: Some(5),
            attempt: 2,
            ..crate::claim::record::sample(state, permanent)
        }
    }

    #[test]
    fn a_settled_key_is_dropped_a_live_lease_waits_and_the_rest_is_lettered() {
        let skew = Duration::from_millis(200);
        let at = |r: &ClaimRecord| decide(Some(r), Some(7), 10_000, skew);
        assert_eq!(
            at(&record(ClaimState::Completed, false, 0)),
            GivenUp::Settled
        );
        assert_eq!(at(&record(ClaimState::Failed, true, 0)), GivenUp::Settled);
        let running = record(ClaimState::InProgress, false, 20_000);
        let owner = "h1".to_string();
        assert_eq!(at(&running), GivenUp::Running { owner });
        let lapsed = record(ClaimState::InProgress, false, 1_000);
        let letter = GivenUp::Letter {
            attempt: 2,
            last_reason: Some("boom".into()),
        };
        assert_eq!(at(&lapsed), letter);
        assert_eq!(at(&record(ClaimState::Failed, false, 0)), letter);
        let never = GivenUp::Letter {
            attempt: 0,
            last_reason: None,
        };
        assert_eq!(decide(None, Some(7), 10_000, skew), never);
    }

    /// A coalesced key completed without running: its given-up message may be the entity's
    /// newest, which must run it, so it is lettered, not dropped as a duplicate.
    #[test]
    fn a_given_up_message_of_a_coalesced_key_is_lettered_not_dropped() {
        let mut coalesced = record(ClaimState::Completed, false, 0);
        coalesced.reason = Some(crate::claim::record::COALESCED_REASON.into());
        let skew = Duration::from_millis(200);
        let letter = GivenUp::Letter {
            attempt: 2,
            last_reason: Some(crate::claim::record::COALESCED_REASON.into()),
        };
        assert_eq!(decide(Some(&coalesced), Some(7), 10_000, skew), letter);
        // Coalesced under an earlier message of the key: this one may be the newest.
        coalesced.source_sequence = Some(6);
        assert_eq!(decide(Some(&coalesced), Some(7), 10_000, skew), letter);
    }

    /// A key coalesced under the given-up message itself, or under a later message of its
    /// key, was skipped for a newer message of its entity that runs (or ran): the message is
    /// settled, not lettered (its replay would run an older update over the newer one).
    #[test]
    fn a_given_up_message_its_key_coalesced_under_it_or_later_is_settled() {
        let mut coalesced = record(ClaimState::Completed, false, 0);
        coalesced.reason = Some(crate::claim::record::COALESCED_REASON.into());
        let skew = Duration::from_millis(200);
        for named in [7, 9] {
            coalesced.source_sequence = Some(named);
            let decided = decide(Some(&coalesced), Some(7), 10_000, skew);
            assert_eq!(decided, GivenUp::Settled, "coalesced under message {named}");
        }
        // Without a message to compare: lettered, as before.
        assert!(matches!(
            decide(Some(&coalesced), None, 10_000, skew),
            GivenUp::Letter { .. }
        ));
    }

    #[test]
    fn a_lettered_key_is_failed_for_good_with_the_letters_reason() {
        let mut r = record(ClaimState::Failed, false, 0);
        failed_for_good(&mut r, reason(7, Some("boom")), 42);
        assert_eq!(
            (r.state, r.permanent, r.retry_at_ms),
            (ClaimState::Failed, true, None)
        );
        assert_eq!(r.updated_ms, 42);
        assert!(r
            .reason
            .unwrap()
            .contains("after 7 deliveries; the last attempt: boom"));
    }
}
