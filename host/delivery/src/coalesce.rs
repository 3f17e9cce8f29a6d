//! Coalescing (`coalesce` on an exclusive route): a queued message is skipped, its key
//! completed without running, when a newer message of its entity waits, since that one runs
//! with the newest state. Only when the newer one will run: one whose key already completed
//! (a key from a JSON pointer, a resend after the dedup window) or was dead-lettered is
//! acked as a duplicate, and skipping for it would leave the entity's update run by neither
//! (issue 42, finding 6). The host reads the newer message and its key's record
//! (`host/src/pipeline/coalesce.rs`), the simulation its model; both decide here.

use crate::claim::{ClaimRecord, ClaimState};
use crate::revert::{reverted, Fix};

/// Whether the newer queued message of source sequence `newest` than ours (source sequence
/// `ours`), whose key's record is `record` (`None`: never claimed), will run, or an update
/// newer than ours already ran: its key is neither completed (other than by coalescing, which
/// a later message runs again) nor failed for good, or a message after ours and no later than
/// the newest completed it ([`ClaimRecord::source_sequence`]: a stale copy of a skipped
/// message must not run after that; the simulation's seed 1252 `--fenced --coalesce`). A key
/// completed by a message past the newest (another entity's, with a key shared across
/// entities) does not count: the newest is then a duplicate and ours must run. With
/// [`Fix::CoalesceBehindRunnable`] reverted (test-only): always, as before that fix.
pub fn will_run(record: Option<&ClaimRecord>, (ours, newest): (u64, u64)) -> bool {
    if reverted(Fix::CoalesceBehindRunnable) {
        return true;
    }
    match record {
        None => true,
        Some(r) => match r.state {
            ClaimState::Completed => {
                r.is_coalesced() || r.source_sequence.is_some_and(|s| s > ours && s <= newest)
            }
            ClaimState::Failed => !r.permanent,
            ClaimState::InProgress => true,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(state: ClaimState, permanent: bool, reason: Option<&str>) -> ClaimRecord {
        ClaimRecord {
            reason: reason.map(str::to_string),
            ..crate::claim::record::sample(state, permanent)
        }
    }

    #[test]
    fn a_newer_message_whose_key_is_settled_will_not_run() {
        // Ours is source message 9, the newest of its entity 12.
        let at = |r: ClaimRecord| will_run(Some(&r), (9, 12));
        assert!(will_run(None, (9, 12)));
        assert!(at(record(ClaimState::InProgress, false, None)));
        assert!(at(record(ClaimState::Failed, false, None)));
        let coalesced = Some(crate::claim::record::COALESCED_REASON);
        assert!(at(record(ClaimState::Completed, false, coalesced)));
        // Completed by a message before ours: the newer one is a duplicate.
        let before = |s| ClaimRecord {
            source_sequence: Some(s),
            ..record(ClaimState::Completed, false, None)
        };
        assert!(!at(record(ClaimState::Completed, false, None)));
        assert!(!at(before(8)));
        assert!(!at(record(ClaimState::Failed, true, None)));
        // Completed by a message after ours, up to the newest: a newer update ran.
        assert!(at(before(10)));
        assert!(at(before(12)));
        // Completed by a message past the newest (another entity's, the key shared): the
        // newest is a duplicate, and ours must run.
        assert!(!at(before(13)));
    }
}
