//! Claims: one record per (route, idempotency key) that decides which host runs a message.
//!
//! - [`record`]: the stored value and its states.
//! - [`key`]: encoding any idempotency key into a valid, collision-free KV key.
//! - [`store`]: the storage trait the protocol reads and writes through (the host implements
//!   it over NATS KV and fenced streams, the simulation over its model), and
//!   [`memory::MemoryClaimStore`] (unit tests, `invoke`).
//! - [`protocol`]: the claim protocol on top of a store (DESIGN.md §2).
//! - [`lease`]: a held claim's writes (heartbeats, effects, the outcome), one at a time.
//! - [`held`]: the revision a lease holds, which fences the run's other writes on the claim.
//! - [`after`]: the single settled write of claim-after routes.

pub mod after;
pub mod held;
pub mod key;
pub mod lease;
pub mod memory;
pub mod protocol;
pub mod record;
pub mod store;

pub use held::HeldRevision;
pub use lease::{Lease, LeaseLost};
pub use protocol::{ClaimOutcome, Claimer};
pub use record::{ClaimRecord, ClaimState, OutputRef};
pub use store::{ClaimError, ClaimStore};
