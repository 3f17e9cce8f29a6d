//! Claims: one KV record per (route, idempotency key) that decides which host runs a message.
//!
//! - [`record`]: the stored value and its states.
//! - [`key`]: encoding any idempotency key into a valid, collision-free KV key.
//! - [`store`]: the storage trait, with [`kv::KvClaimStore`] (NATS KV),
//!   [`stream::StreamClaimStore`] (subjects of a fenced output stream),
//!   [`host::HostClaimStore`] (either, by key) and [`memory::MemoryClaimStore`] (unit tests,
//!   `invoke`).
//! - [`protocol`]: the claim protocol on top of a store (DESIGN.md §2).
//! - [`after`]: the single settled write of claim-after routes.

pub mod after;
pub mod host;
pub mod key;
pub mod kv;
pub mod memory;
pub mod protocol;
pub mod record;
pub mod store;
pub mod stream;

pub use protocol::{ClaimOutcome, Claimer, Lease, LeaseLost};
pub use record::{ClaimRecord, ClaimState, OutputRef};
pub use store::{ClaimError, ClaimStore};
