//! The revision a held claim's last own write landed at, as its [`super::Lease`] tracks it,
//! shared with what fences other writes on the claim (the call journal, DESIGN.md rule 24):
//! a write conditional on the claim's subject still being at this revision lands only if
//! nobody wrote the claim since this run's last write, so it needs no read of the claim first.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The revision a [`super::Lease`]'s last landed write has, or none once the lease is lost or
/// settled (its outcome is recorded: nothing more may be written under it). Cheap to clone;
/// every clone sees the lease's later writes.
#[derive(Clone, Debug, Default)]
pub struct HeldRevision(Arc<AtomicU64>);

/// The value of a revision that is not held (claim revisions start at 1).
const NONE: u64 = 0;

impl HeldRevision {
    /// A revision held at `revision` (a lease's first write; tests).
    pub fn new(revision: u64) -> Self {
        Self(Arc::new(AtomicU64::new(revision)))
    }

    /// The claim's revision while the lease holds it; `None` once it is lost or settled.
    pub fn get(&self) -> Option<u64> {
        match self.0.load(Ordering::Acquire) {
            NONE => None,
            revision => Some(revision),
        }
    }

    /// The lease's write landed at `revision`.
    pub(super) fn set(&self, revision: u64) {
        self.0.store(revision, Ordering::Release);
    }

    /// The lease is lost or settled: no write may be fenced by it any more.
    pub(super) fn clear(&self) {
        self.0.store(NONE, Ordering::Release);
    }
}
