//! The route's contract key on the model server, which the hosts' contract store
//! (`SimContracts`, in `sim/store.rs`) reads and writes by revision.

use dedup_host::contract::{Changing, ContractRecord};

/// The route's contract key on the model server ([`super::World::contract`]): its revision
/// (0: never written), whether its latest entry is a deletion (an operator's `kv del`), and
/// the last record put, kept after a deletion (the claims stay where that contract put them).
#[derive(Debug, Clone, Default)]
pub struct ContractKey {
    /// The last record put, if any.
    pub record: Option<ContractRecord>,
    /// The key's revision: each put and each deletion is one.
    pub revision: u64,
    /// Whether the latest entry is a deletion.
    pub deleted: bool,
    /// The mark of a contract change under way (`setup --change-route`), beside the record.
    pub changing: Option<Changing>,
}

impl ContractKey {
    /// An operator deletes the record (the hosts' contract watches see a new revision).
    pub fn delete(&mut self) {
        self.revision += 1;
        self.deleted = true;
        self.changing = None;
    }
}
