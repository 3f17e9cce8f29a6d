//! What `dedup-host setup --rename-route OLD NEW` decides (issue 42, finding 3: a route
//! renamed in the config started over, a new consumer from the first retained message and no
//! claims, so it ran the retained history again). The host's rename (`host/src/rename.rs`)
//! does the I/O around these decisions, and the simulation's operator
//! (`tests/src/sim/host/rename.rs`) calls the same functions over its model:
//! - whether a key of `OLD` is too open to move ([`unsettled`]): the rename is refused;
//! - which claim key of `NEW` a claim key of `OLD` becomes ([`renamed_key`]);
//! - what record is written there ([`carried`]): the same, with its outputs' ids and its
//!   calls' idempotency keys still those of the old key;
//! - whether, on a claim-after route, `OLD`'s consumer still has deliveries open
//!   ([`pending_refuses`]) or the server gave up on messages of `OLD` that are not
//!   dead-lettered yet ([`given_up_refuses`]): the rename is refused;
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

/// The old route's consumer as the server reports it (`consumer info`), read once no host
/// serves the route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OldConsumer {
    /// Its ack floor's stream sequence: every message up to it is acknowledged (or given
    /// up on, by a server that moves the floor past such a message).
    pub ack_floor: u64,
    /// The stream sequence of the last message it delivered (`delivered.stream_seq`).
    pub delivered: u64,
    /// Its deliveries not acknowledged (`num_ack_pending`); a message the server gave up on
    /// is not counted.
    pub ack_pending: u64,
}

/// Why messages the server gave up on keep a claim-after rename from going ahead
/// ([`given_up_refuses`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GivenUp {
    /// Stranded-message markers (`=stranded.<stream>.<sequence>.<consumer>`) stand for these source
    /// stream sequences of messages the old route consumes: the server gave up on them and
    /// their letters are not stored yet.
    Marked(Vec<u64>),
}

/// Whether messages the server gave up on (delivered `server_max_deliver` times) keep a
/// claim-after route (`claim_after`) from being renamed, given the source stream sequences of
/// the messages it consumes that a stranded-message marker stands for (`marked`). Such a
/// message is no longer pending, yet a run of it may have published part of its outputs
/// under ids of the old name and left no record (its publish-failed mark refused, say by a
/// claim-store leader election that outlasted every delivery; found by the simulation, seed
/// 14265 `--claim-after`), so nothing is carried for its key, and the host's marker sweep
/// would dead-letter it under the new name once the rename is done (the route the config then
/// names for its subject): a replay of that letter would run it under the new name,
/// publishing those outputs again under other ids. Refused until the sweep has dead-lettered
/// it under the old name, which records its key failed for good with its effects unknown
/// ([`unsettled`] then refuses the key until its letter is replayed under the old name or the
/// key is accepted). A given-up message without a marker is never delivered again under the
/// new name either: a claim-after route's new consumer starts after the last message the old
/// one delivered ([`start`]). A claim-before key records that it began before it publishes:
/// [`unsettled`] covers it. `None`: nothing refuses (or [`Fix::RenameWaitsForGivenUp`] is
/// reverted, test-only).
pub fn given_up_refuses(claim_after: bool, marked: &[u64]) -> Option<GivenUp> {
    if !claim_after || marked.is_empty() || revert::reverted(Fix::RenameWaitsForGivenUp) {
        return None;
    }
    let mut marked = marked.to_vec();
    marked.sort_unstable();
    marked.dedup();
    Some(GivenUp::Marked(marked))
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

/// The stream sequence the new name's consumer starts at, given the old consumer (`old`) and
/// whether the route claims after its run (`claim_after`): after its ack floor (the last
/// stream sequence below which it acknowledged everything), so every message not settled
/// under the old name is delivered again; on a claim-after route, whose rename waits until
/// nothing is pending ([`pending_refuses`]), after the last message it delivered, which is
/// where the old consumer would go on: a message the server gave up on between the floor
/// and there (nats-server 2.15 leaves the floor below it until a later message is
/// acknowledged with none pending) is never delivered again, as under the old name, rather
/// than run under the new name with new ids. `None`: from the first retained message,
/// `DeliverPolicy::All` (test-only, [`Fix::RenameCarriesHistory`] reverted).
pub fn start(old: OldConsumer, claim_after: bool) -> Option<u64> {
    if revert::reverted(Fix::RenameCarriesHistory) {
        return None;
    }
    match claim_after && !revert::reverted(Fix::RenameWaitsForGivenUp) {
        true => Some(old.delivered.max(old.ack_floor) + 1),
        false => Some(old.ack_floor + 1),
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
    fn a_claim_after_route_waits_for_messages_the_server_gave_up_on() {
        // Seed 14265 `--claim-after`: message 11 given up, marked (with message 4).
        assert_eq!(
            given_up_refuses(true, &[11, 4, 11]),
            Some(GivenUp::Marked(vec![4, 11]))
        );
        assert_eq!(given_up_refuses(true, &[]), None);
        // A claim-before key records that it began before it publishes.
        assert_eq!(given_up_refuses(false, &[11]), None);
    }

    #[test]
    fn the_new_consumer_starts_after_the_old_ones_ack_floor() {
        let old = |ack_floor, delivered| OldConsumer {
            ack_floor,
            delivered,
            ack_pending: 0,
        };
        assert_eq!(start(old(0, 0), false), Some(1));
        assert_eq!(start(old(41, 45), false), Some(42));
        // Claim after: after the last delivery, so a message given up on above the floor
        // (nats-server 2.15 keeps the floor below it) is not delivered again under the new
        // name, with no marker to refuse the rename (its write refused too).
        assert_eq!(start(old(3, 11), true), Some(12));
        assert_eq!(start(old(11, 11), true), Some(12));
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
