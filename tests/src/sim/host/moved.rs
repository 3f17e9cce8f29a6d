//! How the simulation judges the claim records a contract change left in the old claim
//! space ([`super::change`]): what the move's fence changes in a record, and which records
//! no one can have moved.

use dedup_host::claim::{ClaimRecord, ClaimState};

/// `record` as the move leaves it in both stores: the fence clears the old store's fencing
/// token (`change::fence`), the copy keeps it.
pub(super) fn unfenced(record: &ClaimRecord) -> ClaimRecord {
    ClaimRecord {
        fencing_token: None,
        ..record.clone()
    }
}

/// Whether `key`, holding `record` in the old claim space, is a claim created there after the
/// move listed the keys (`listed`): a create sent by a host before it drained whose answer was
/// lost, landing late. Nothing ran under it: its host, finding no record, gave the claim up
/// before it drained (the change waits for every host to drain; a host that found it would
/// still be running the key). The key's message runs under the new contract; the claim left
/// behind in the old space is no one's (`setup --change-route` fences the keys it lists, not
/// those it cannot know of: `change::fence`). A create is a first attempt never written again
/// (no fencing token), naming at most its own version (a window route's claim names it:
/// `Claimer::claim_window_message`).
pub(super) fn late_create(listed: &[String], key: &str, record: &ClaimRecord) -> bool {
    !listed.iter().any(|k| k == key)
        && record.state == ClaimState::InProgress
        && record.attempt == 1
        && record.fencing_token.is_none()
        && !record.unknown_effects
        && record
            .effects_by
            .as_ref()
            .is_none_or(|v| *v == record.digest)
}
