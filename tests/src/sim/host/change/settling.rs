//! The operator's change of a claim-after route waits for the old contract's open messages
//! ([`change::open_refuses`]): refused, the operator reloads the old config, so the hosts
//! serve the route again and settle them, calls the change off, and tries it again later.

use dedup_delivery::change;
use dedup_host::config::ClaimMode;
use dedup_host::contract::RouteContract;

use super::super::super::consumer::Lane;
use super::super::{log, Hosts};
use super::Change;

/// How many times the operator lets the old contract's open messages settle before leaving
/// the route under its old contract.
const SETTLES: u32 = 12;

impl Change {
    /// When the operator, having called the change off (or found nothing to call off) with
    /// the old config, tries it again: later, with the new config, if it went back only for
    /// the old contract's open messages to settle and has tries left.
    pub(super) fn again_after_settling(&mut self, now: u64) -> Option<u64> {
        if !std::mem::take(&mut self.settling) || self.settles >= SETTLES {
            return None;
        }
        self.back = false;
        self.reloaded = false;
        Some(now + self.rng.range(5_000, 15_000))
    }
}

impl Hosts {
    /// Whether run `number` (`id`, marking the record `first`) from contract `old` to `wanted`
    /// is refused for the old contract's open messages, read once no host serves the route:
    /// delivered and not acknowledged, or given up by the server and not lettered yet (read as
    /// the host reads them: the consumers' `num_ack_pending` and the stranded-message markers). Then the
    /// operator goes back to the old config, and acts again at `again`.
    pub(super) fn waits_for_open(
        &mut self,
        (number, id, first): (u32, &str, bool),
        (old, wanted): (&RouteContract, &RouteContract),
        again: u64,
    ) -> bool {
        let open = {
            let w = self.world.lock().expect("one thread");
            // Given up and not lettered yet, as the host reads them: by their markers (a
            // lettered source message stays in its stream, given up, and is not open), less a
            // queued copy's marker whose copy is gone (the host finds no message for it).
            let given_up = (w.streams.markers.keys())
                .filter(|(lane, sequence)| {
                    *lane != Lane::Queue || !w.streams.message(*lane, *sequence).deleted
                })
                .count() as u64;
            w.streams.ack_pending() + given_up
        };
        let after = |c: &RouteContract| c.claim == ClaimMode::After;
        if !change::open_refuses(after(old), after(wanted), open) {
            return false;
        }
        log(&self.world, || {
            format!("change run {number} refused: a claim-after route with {open} messages not settled; the operator reloads the old config for them to settle and calls the change off")
        });
        self.stopped(id, change::stop(false, true, first));
        self.change.settles += 1;
        self.change.settling = true;
        self.change.back = true;
        self.reload_all(false);
        self.change.at = Some(again);
        true
    }
}
