//! What a route's rename leaves in the model server: the claim records it carries to the new
//! name (written by the operator's tool, no faults), and the check that no key settled under
//! the old name runs again under the new one.

use dedup_host::claim::ClaimRecord;

use super::{Op, World};

impl World {
    /// Creates `key` with `record` for an operator's tool (no faults): its revision, or `None`
    /// when the key exists.
    pub fn operator_create(&mut self, key: &str, record: &ClaimRecord) -> Option<u64> {
        let op = Op::Create(key.to_string(), record.clone());
        self.apply(&op).ok()
    }

    /// `key`'s claim key under the route's current name, in the claim space `space`.
    pub fn claim_key(&self, space: &str, key: &str) -> String {
        format!("{space}{}{key}", self.route)
    }

    /// A handler of `key` starts on a host serving the route as `route`: a key completed
    /// under an earlier name must not run again (issue 42, finding 3).
    pub fn runs(&mut self, route: &str, key: &str) {
        let Some(before) = self.settled_before.get(key) else {
            return;
        };
        if before != route && !self.replayed.contains(key) {
            let what = format!(
                "key {key}, completed under route name {before:?}, runs again under {route:?}"
            );
            self.log(|| format!("VIOLATION {what}"));
            self.violations.push(what);
        }
    }
}
