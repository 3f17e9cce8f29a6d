//! dedup-host's delivery logic, free of the NATS client and the Wasm runtime.
//!
//! Everything here decides; nothing here talks to a server. The host's adapters (async-nats and
//! tokio) and the simulation (`tests/src/sim`, a model of the server in virtual time) call the
//! same functions, so a fix made here is a fix the simulation runs.
//!
//! - [`claim`]: the claim protocol (records, keys, leases, the store trait it runs on).
//! - [`backoff`]: how long a message waits before its next delivery when it could not run now
//!   (an outage, a full instance pool, a key busy elsewhere); [`outage`]: a route's run of
//!   infrastructure errors in a row and the outage backoff it sets.
//! - [`settle`]: what follows a claimed delivery's outcome, in the order that keeps it exactly
//!   once (publish, record, ack; fail, nak; release; dead-letter, record, terminate), over the
//!   [`settle::Settling`] seam.
//! - [`before`]: a claim-before delivery from the claim's answer to its settlement (busy,
//!   duplicate, or the handler run beside the [`heartbeat`] that renews its lease, on a
//!   [`clock`]), over the [`before::Unclaimed`] and [`before::ClaimedDelivery`] seams.
//! - [`after`]: a claim-after delivery from the read of its key to its one settled write
//!   (duplicate, or the handler run, then publish, record, ack; retry; dead-letter), over the
//!   [`after::AfterDelivery`] seam.
//! - [`queue`]: an exclusive route's source message copied onto its entity's partition, then
//!   acked, over the [`queue::Queueing`] seam; [`marker`]: the stranded-message marker around
//!   a message's last delivery, over the [`marker::Marking`] seam; [`undeliverable`]: what
//!   becomes of a message the server gave up delivering, from its key's record; [`ahead`]: a
//!   queued message waits while an earlier one of its entity is still in the queue, and is
//!   dropped once its own copy is gone; [`coalesce`]: whether a newer message
//!   of the entity will run, so that an older one may be skipped.
//! - [`group`]: fenced commits of several messages sent as one atomic batch, one batch of a
//!   stream in flight at a time, over the [`group::Batches`] seam.
//! - [`journal`]: the journal of a run's outbound HTTP calls (PENDING before sending, SENT
//!   before the guest sees the answer, replayed by a re-run), over the [`journal::CallStore`]
//!   seam.
//! - [`contract`]: a route's contract record read, or recorded where the writer may, over the
//!   [`contract::ContractStore`] seam; [`agreement`]: what a host does with a route once it
//!   compared it with its contract, and when the record changes; [`reload`]: which routes a
//!   config reload keeps, starts and retires, and which fenced routes refuse it.
//! - [`pinned`]: which version runs a claimed key whose effects a version began (canaries,
//!   rollbacks, promotions), and what becomes of it once that version is gone.
//! - [`revert`]: test-only switches that each undo one fix (the simulation's canaries).
//! - [`outcome`]: how a delivery ended and where a repeat was caught.
//! - [`subject`]: NATS subject grammar (filters, literals, the server's and the host's reserved
//!   namespaces); [`text`]: reasons and header values made safe to store and show;
//!   [`redact`]: secrets in outbound call URLs masked where people read them.

#![warn(missing_docs)]

pub mod after;
pub mod agreement;
pub mod ahead;
pub mod backoff;
pub mod before;
pub mod change;
pub mod claim;
pub mod clock;
pub mod coalesce;
pub mod contract;
pub mod copier;
pub mod group;
pub mod heartbeat;
pub mod journal;
pub mod marker;
pub mod outage;
pub mod outcome;
pub mod pinned;
pub mod queue;
pub mod redact;
pub mod reload;
pub mod rename;
pub mod revert;
pub mod settle;
pub mod subject;
pub mod text;
pub mod undeliverable;
