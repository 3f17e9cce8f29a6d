//! The route's versions under traffic (issue 42, finding 8): a candidate deployed, its canary
//! split moved, promoted or rolled back at the times the run drew ([`Components`]), and each
//! running host's watch of the components bucket loading each change after a moment, as a
//! host learns of a new version (a host cut off from the server sees nothing until it heals;
//! a restarted one loads what the bucket says).
//!
//! [`Components`]: super::super::world::Components

use super::Hosts;

impl Hosts {
    /// Applies the changes of the route's versions due at `now`; each running host's watch
    /// may see the latest.
    pub(super) fn candidates(&mut self, now: u64) {
        let mut w = self.world.lock().expect("one thread");
        for line in w.components.due(now) {
            w.log(|| line);
        }
        for (i, h) in self.hosts.iter().enumerate() {
            if !h.ready(now) || w.network.cut_off(i, now) {
                continue;
            }
            if let Some(line) = w.components.watch(i) {
                w.log(|| line);
            }
        }
    }
}
