//! A simulated host's stranded-message marker as the host's own [`dedup_delivery::marker`]
//! sees it: kept in the model beside the message it names, due two ack waits after the mark
//! (a running host sweeps it then). When to mark and when to forget are the host's.

use dedup_delivery::marker::Marking;

use super::consumer::Delivery;
use super::ctx::{At, Ctx};

/// The marker of a delivery that is the server's last.
pub(super) struct SimMarker<'a> {
    pub(super) ctx: &'a Ctx,
    pub(super) at: &'a At,
}

impl Marking for SimMarker<'_> {
    async fn mark(&self) {
        if !self.ctx.reaches_server().await {
            return; // the marker's write timed out: none is written
        }
        let mut w = self.ctx.world();
        let due = w.now + 2 * self.ctx.settings.ack_wait_ms;
        w.streams
            .markers
            .insert((self.at.lane, self.at.sequence), (due, 0));
    }

    /// The message is done (the model does not tell whose ack settled it).
    fn ended(&self) -> bool {
        let w = self.ctx.world();
        w.streams.message(self.at.lane, self.at.sequence).delivery == Delivery::Done
    }

    async fn forget(&self) {
        if !self.ctx.reaches_server().await {
            return; // the marker stays, and the sweep finds its message settled
        }
        let at = (self.at.lane, self.at.sequence);
        self.ctx.world().streams.markers.remove(&at);
    }
}
