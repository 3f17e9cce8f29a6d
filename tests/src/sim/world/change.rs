//! What a contract change (`setup --change-route`, `sim/host/change.rs`) reads of the model
//! server at once: the route's claim keys in a claim space, as the stream's leader lists them
//! (STREAM.INFO with a subjects filter); each record is then read and copied through the
//! scheduler, with the model's faults.

use dedup_host::claim::ClaimRecord;

use super::World;

impl World {
    /// The route's claim keys (as a host's claim store names them, without the space) in
    /// claim space `space`, each with its current record.
    pub fn claims_in(&self, space: &str) -> Vec<(String, ClaimRecord)> {
        let prefix = format!("{space}{}", self.route);
        (self.kv.iter())
            .filter(|(k, _)| k.starts_with(&prefix))
            .filter_map(|(k, h)| Some((k[space.len()..].to_string(), h.last()?.0.clone())))
            .collect()
    }
}
