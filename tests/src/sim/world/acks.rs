//! What a host's acks, naks, terms and progress acks do to the model's consumers.

use super::super::consumer::{Delivery, Lane};
use super::World;

impl World {
    /// Whether what host `host` sends to `lane`'s consumer (of generation `consumer`, a
    /// source consumer's) is lost: the host is partitioned from the server, the stream is
    /// electing a leader, or that consumer was deleted.
    fn unheard(&mut self, host: usize, lane: Lane, consumer: Option<u32>, what: &str) -> bool {
        let now = self.now;
        let why = if self.network.cut_off(host, now) {
            "the host is cut off"
        } else if self.network.electing(lane.into(), now) {
            "the stream has no leader"
        } else if consumer.is_some_and(|c| c != self.streams.source_generation) {
            "its consumer was deleted (the route was renamed)"
        } else {
            return false;
        };
        self.log(|| format!("{what} from h{host} lost: {why}"));
        true
    }

    /// Settles delivery `number` of `sequence` in `lane` for host `host`, handed out by
    /// consumer generation `consumer`; `None` acks or terms, `Some(delay)` naks. An answer to
    /// an older delivery still settles the message, as on the server.
    pub fn settle(
        &mut self,
        host: usize,
        (lane, sequence, number, consumer): (Lane, u64, u64, u32),
        nak: Option<u64>,
    ) {
        let generation = (lane == Lane::Source).then_some(consumer);
        if self.unheard(
            host,
            lane,
            generation,
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

    /// A progress ack from host `host` (to consumer generation `consumer`): the ack wait
    /// starts again.
    pub fn progress(
        &mut self,
        host: usize,
        (lane, sequence, number, consumer): (Lane, u64, u64, u32),
    ) {
        let generation = (lane == Lane::Source).then_some(consumer);
        if self.unheard(
            host,
            lane,
            generation,
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
