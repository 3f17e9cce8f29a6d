//! The source stream's retained history: acked messages stay in the stream (limits
//! retention), so a new consumer delivers every message from where it starts, acked or not
//! (`DeliverPolicy::All`, or `ByStartSequence` as a renamed route's consumer starts).

use super::{Delivery, Streams};

impl Streams {
    /// The source consumer's ack floor: the last stream sequence up to which every message is
    /// acknowledged, termed or deleted (0: none).
    pub fn ack_floor(&self) -> u64 {
        let settled = self
            .source
            .iter()
            .take_while(|m| m.delivery == Delivery::Done);
        settled.count() as u64
    }

    /// The stream sequence of the last source message the source consumer delivered (its
    /// `delivered.stream_seq`), or its ack floor if that is higher (a new consumer that has
    /// delivered nothing yet).
    pub fn delivered(&self) -> u64 {
        let delivered = (self.source.iter())
            .filter(|m| m.deliveries > 0)
            .map(|m| m.sequence)
            .max();
        delivered.unwrap_or(0).max(self.ack_floor())
    }

    /// The source consumer's deliveries not acknowledged (its `num_ack_pending`): messages
    /// out, or delivered and waiting for their redelivery (naked, or their ack wait ran out).
    /// One the server gave up on is not counted.
    pub fn ack_pending(&self) -> u64 {
        let open = |m: &&super::Message| {
            m.deliveries > 0 && matches!(m.delivery, Delivery::Out { .. } | Delivery::Available(_))
        };
        self.source.iter().filter(open).count() as u64
    }

    /// Deletes the source consumer and creates another delivering from stream sequence
    /// `start` (`None`: from the first retained message), at `now`: every message from there
    /// that is still in the stream is delivered again, its delivery count starting over, by a
    /// consumer that knows nothing of the old one's acks; what a host sends to the old one
    /// from now on is lost (`World::settle`). Returns how many messages it will deliver again
    /// that the old consumer had settled.
    pub fn replace_source_consumer(&mut self, start: Option<u64>, now: u64) -> usize {
        self.source_generation += 1;
        let from = start.unwrap_or(1);
        let mut again = 0;
        for m in (self.source.iter_mut()).filter(|m| m.sequence >= from) {
            again += usize::from(m.delivery == Delivery::Done);
            m.delivery = match m.delivery {
                // Not published yet.
                Delivery::Available(at) if at > now => Delivery::Available(at),
                _ => Delivery::Available(now),
            };
            m.deliveries = 0;
        }
        again
    }
}
