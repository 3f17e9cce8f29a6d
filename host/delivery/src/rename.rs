//! What `dedup-host setup --rename-route OLD NEW` decides (issue 42, finding 3: a route
//! renamed in the config started over, a new consumer from the first retained message and no
//! claims, so it ran the retained history again). The host's rename (`host/src/rename.rs`)
//! does the I/O around these decisions, and the simulation's operator
//! (`tests/src/sim/rename.rs`) calls the same functions over its model:
//! - whether a key of `OLD` is too open to move ([`unsettled`]): the rename is refused;
//! - which claim key of `NEW` a claim key of `OLD` becomes ([`renamed_key`]);
//! - what record is written there ([`carried`]): the same, with its outputs' ids and its
//!   calls' idempotency keys still those of the old key;
//! - where `NEW`'s consumer starts ([`start`]): after the last message `OLD`'s consumer had
//!   acknowledged in order (its ack floor), so every message not settled under `OLD` is
//!   delivered again under `NEW` and every one acknowledged past the floor finds its copied
//!   claim and is acknowledged without running.

use crate::claim::{ClaimRecord, ClaimState};
use crate::revert::{self, Fix};

/// Whether a key of the old name, recorded as `record`, keeps the rename from going ahead: in
/// progress, failed and due again, or dead-lettered after its window outputs may have been
/// stored (unless the operator accepted it, `accepted`). Any of these may have published
/// outputs under ids derived from the old name, and a run under the new name would publish
/// them again under other ids.
pub fn unsettled(record: &ClaimRecord, accepted: bool) -> bool {
    match record.state {
        ClaimState::InProgress => true,
        ClaimState::Failed => !record.permanent || (record.may_have_effects() && !accepted),
        ClaimState::Completed => false,
    }
}

/// Whether the old consumer's open deliveries keep a rename from going ahead: on a
/// claim-after route (`claim_after`), a message delivered and not acknowledged (the
/// consumer's `ack_pending`, naked or waiting for its redelivery) may have had its outputs
/// published under ids of the old name while its key has no record yet (the settled write
/// went unanswered, or its host stopped between the two): no record shows it, none is
/// carried, and its run under the new name would publish them again under other ids (found by
/// the simulation). A claim-before key records that it began before it publishes, which
/// [`unsettled`] refuses.
pub fn pending_refuses(claim_after: bool, ack_pending: u64) -> bool {
    claim_after && ack_pending > 0 && !revert::reverted(Fix::RenameWaitsForClaimAfter)
}

/// The claim key of route `new` that claim key `claim_key` of route `old` becomes (the key's
/// route prefix replaced; `claim_key` starts with `old`).
pub fn renamed_key(old: &str, new: &str, claim_key: &str) -> String {
    format!("{new}{}", &claim_key[old.len()..])
}

/// The record a rename writes under the new name for `record`, stored under the old name's
/// `claim_key`: its outputs keep the ids they were published under (`outputs_as`) and its
/// outbound calls their idempotency keys (`calls_as`; a key renamed before keeps its first
/// name's). `None`: nothing is carried (test-only, [`Fix::RenameCarriesHistory`] reverted).
pub fn carried(mut record: ClaimRecord, claim_key: &str) -> Option<ClaimRecord> {
    if revert::reverted(Fix::RenameCarriesHistory) {
        return None;
    }
    if record.outputs_as.is_none() {
        record.outputs_as = Some(claim_key.to_string());
    }
    if record.calls_as.is_none() {
        record.calls_as = Some(claim_key.to_string());
    }
    Some(record)
}

/// The stream sequence the new name's consumer starts at, given the old consumer's ack floor
/// (the last stream sequence below which it acknowledged everything): the one after it.
/// `None`: from the first retained message, `DeliverPolicy::All` (test-only,
/// [`Fix::RenameCarriesHistory`] reverted).
pub fn start(ack_floor: u64) -> Option<u64> {
    match revert::reverted(Fix::RenameCarriesHistory) {
        true => None,
        false => Some(ack_floor + 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::record::sample;

    #[test]
    fn a_key_moves_under_the_new_name_with_its_old_ids() {
        assert_eq!(
            renamed_key("orders", "billing", "orders.k.x"),
            "billing.k.x"
        );
        let record = carried(sample(ClaimState::Completed, false), "orders.k.x").expect("carried");
        assert_eq!(record.outputs_as.as_deref(), Some("orders.k.x"));
        assert_eq!(record.calls_as.as_deref(), Some("orders.k.x"));
        let mut twice = sample(ClaimState::Completed, false);
        twice.outputs_as = Some("first.k.x".into());
        let record = carried(twice, "orders.k.x").expect("carried");
        assert_eq!(record.outputs_as.as_deref(), Some("first.k.x"));
    }

    #[test]
    fn a_claim_after_route_waits_for_its_open_deliveries() {
        assert!(pending_refuses(true, 1));
        assert!(!pending_refuses(true, 0));
        assert!(!pending_refuses(false, 3));
    }

    #[test]
    fn the_new_consumer_starts_after_the_old_ones_ack_floor() {
        assert_eq!(start(0), Some(1));
        assert_eq!(start(41), Some(42));
    }

    #[test]
    fn open_keys_refuse_the_rename_settled_ones_move() {
        assert!(unsettled(&sample(ClaimState::InProgress, false), false));
        assert!(!unsettled(&sample(ClaimState::Completed, false), false));
        assert!(unsettled(&sample(ClaimState::Failed, false), true));
        let mut r = sample(ClaimState::Failed, true);
        assert!(!unsettled(&r, false));
        r.unknown_effects = true;
        assert!(unsettled(&r, false));
        assert!(!unsettled(&r, true));
    }
}
