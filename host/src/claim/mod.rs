//! Claims: the protocol lives in the delivery crate ([`dedup_delivery::claim`], re-exported
//! here); this module holds its stores over NATS.
//!
//! - [`kv::KvClaimStore`]: claims in a NATS KV bucket.
//! - [`stream::StreamClaimStore`]: claims as subjects of a fenced output stream.
//! - [`host::HostClaimStore`]: either, by key.
//! - [`journal::NatsCallStore`]: a run's outbound-call journal, beside its claim.

pub use dedup_delivery::claim::{after, key, memory, protocol, record, store};
pub use dedup_delivery::claim::{
    ClaimError, ClaimOutcome, ClaimRecord, ClaimState, ClaimStore, Claimer, Lease, LeaseLost,
    OutputRef,
};

pub mod host;
pub mod journal;
pub mod kv;
pub mod stream;
