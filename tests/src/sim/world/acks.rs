//! What a host's acks, naks, terms and progress acks do to the model's consumers.

use super::super::consumer::{Delivery, Lane};
use super::World;

impl World {
    /// Whether what host `host` sends to `lane`'s consumer is lost: the host is partitioned
    /// from the server, or the stream is electing a leader.
    fn unheard(&mut self, host: usize, lane: Lane, what: &str) -> bool {
        let now = self.now;
        let why = if self.network.cut_off(host, now) {
            "the host is cut off"
        } else if self.network.electing(lane.into(), now) {
            "the stream has no leader"
        } else {
            return false;
        };
        self.log(|| format!("{what} from h{host} lost: {why}"));
        true
    }

    /// Settles delivery `number` of `sequence` in `lane` for host `host`; `None` acks or
    /// terms, `Some(delay)` naks. An answer to an older delivery still settles the message,
    /// as on the server.
    pub fn settle(
        &mut self,
        host: usize,
        lane: Lane,
        sequence: u64,
        number: u64,
        nak: Option<u64>,
    ) {
        if self.unheard(
            host,
            lane,
            &format!("settle of {lane:?} {sequence}#{number}"),
        ) {
            return;
        }
        if self.faulty && self.rng.chance(self.faults.lost_ack) {
            self.log(|| format!("settle of {lane:?} {sequence}#{number} lost"));
            return;
        }
        let now = self.now;
        let m = &mut self.streams.lane_mut(lane)[sequence as usize - 1];
        if matches!(m.delivery, Delivery::Out { .. }) {
            m.delivery = match nak {
                None => Delivery::Done,
                Some(delay) => Delivery::Available(now + delay),
            };
        }
        self.log(|| {
            format!(
                "settle {lane:?} {sequence}#{number}: {}",
                nak.map_or("ack".into(), |d| format!("nak {d} ms"))
            )
        });
    }

    /// A progress ack from host `host`: the ack wait starts again.
    pub fn progress(&mut self, host: usize, lane: Lane, sequence: u64, number: u64) {
        if self.unheard(
            host,
            lane,
            &format!("progress of {lane:?} {sequence}#{number}"),
        ) {
            return;
        }
        let deadline = self.now + self.streams.ack_wait_ms;
        let m = &mut self.streams.lane_mut(lane)[sequence as usize - 1];
        if let Delivery::Out { number: n, .. } = m.delivery {
            if n == number {
                m.delivery = Delivery::Out { number, deadline };
            }
        }
    }
}
