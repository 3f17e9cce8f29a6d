//! Whether an exclusive partition's queued delivery, its claim just won, may still run. A
//! partition hands out one message at a time (`max_ack_pending = 1`), but once the server
//! gave up on a message (its delivery bound reached, the last ack wait run out) it hands out
//! the next, whose look at what is ahead ([`crate::ahead::clear`]) saw no live lease if this
//! claim had not landed yet: running now could overlap it.
//!
//! The host cannot tell from its own clock alone: a delivery can wait in the client's buffer
//! behind the partition's permit, so the time since the host took it up may be near zero
//! while the server gave up on it long ago. So once the claim is won, the partition's
//! consumer is asked (its info: `delivered.stream_seq`, its `ack_wait` and `max_deliver`, not
//! the host's config, which a rolling change can make differ): if it handed out a later
//! message, the server moved past this one. Read after the claim landed, that answer is
//! safe: a later message handed out after the read finds this claim's live lease. The seam
//! is [`crate::before::ClaimedDelivery::partition`].

use std::time::Duration;

use crate::revert::{reverted, Fix};

/// What a partition's consumer says of itself (its info).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// The stream sequence of the latest message it handed out (`delivered.stream_seq`;
    /// redeliveries do not move it).
    pub handed_out: u64,
    /// Its ack wait.
    pub ack_wait: Duration,
    /// Its delivery bound (`max_deliver`; 0 or less: none).
    pub max_deliver: i64,
}

/// A queued delivery whose claim was won: where it stands in its partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queued {
    /// Its sequence in the work queue.
    pub sequence: u64,
    /// Which delivery of the message it is (1-based).
    pub delivered: u64,
    /// How long since this host took it up (the server sent it at least that long ago).
    pub since: Duration,
    /// The claims' clock skew margin.
    pub skew: Duration,
    /// Whether its route coalesces: one that does acks the updates it skips while an earlier
    /// one runs, so its partition moves past messages the server did not give up on.
    pub coalescing: bool,
    /// The partition's consumer as this host's config describes it (`handed_out` unknown: 0),
    /// judged by when its info cannot be read.
    pub configured: Partition,
}

/// Why a claimed queued delivery must not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Late {
    /// The partition's consumer handed out a later message: the server gave up on this one.
    MovedPast,
    /// Its last delivery, whose ack wait (less the skew margin) ran out before the claim was
    /// answered: the server may give up on it any moment, if it has not already.
    AckWaitSpent,
}

impl Late {
    /// Why, for the record and the log.
    pub fn reason(self) -> &'static str {
        match self {
            Late::MovedPast => {
                "the server gave up on this delivery before its claim landed: its partition handed out a later message"
            }
            Late::AckWaitSpent => {
                "the server gave up on this delivery before its claim landed: its last ack wait ran out"
            }
        }
    }
}

/// Whether queued delivery `q` must not run, given its partition's consumer as `read` (its
/// info, or `None` when it could not be read: then by the host's config).
pub fn late(q: &Queued, read: Option<&Partition>) -> Option<Late> {
    if reverted(Fix::AheadLate) {
        return None;
    }
    // Reverted (test-only): judged by the host's clock and config alone.
    let read = read.filter(|_| !reverted(Fix::PartitionConsumerInfo));
    let bounds = read.unwrap_or(&q.configured);
    let last = bounds.max_deliver > 0 && q.delivered >= bounds.max_deliver as u64;
    // The server moves past a message only once it is acked or out of deliveries. A claim
    // won by a copy of an acked message is never won (its key settled), so on a route that
    // does not coalesce a later message handed out means this copy is stale: the server
    // redelivered the message since, up to its last delivery, and gave up (a copy that
    // waited in a paused host's buffer, its delivery not the last). A coalescing route acks
    // the updates it skips while the first one runs, so there only a last delivery says so.
    let moved_past = read.is_some_and(|p| p.handed_out > q.sequence);
    let stale = !q.coalescing && !reverted(Fix::LateBeforeLast);
    if moved_past && (last || stale) {
        return Some(Late::MovedPast);
    }
    (last && q.since + q.skew >= bounds.ack_wait).then_some(Late::AckWaitSpent)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partition(handed_out: u64, ack_wait_s: u64, max_deliver: i64) -> Partition {
        Partition {
            handed_out,
            ack_wait: Duration::from_secs(ack_wait_s),
            max_deliver,
        }
    }

    fn queued(delivered: u64, since_s: u64) -> Queued {
        Queued {
            sequence: 7,
            delivered,
            since: Duration::from_secs(since_s),
            skew: Duration::from_secs(2),
            coalescing: false,
            configured: partition(0, 30, 4),
        }
    }

    #[test]
    fn a_delivery_the_partition_moved_past_is_late_however_fresh_it_looks() {
        // Its last delivery, taken up just now (it waited in the client's buffer).
        let moved = partition(8, 30, 100);
        assert_eq!(late(&queued(100, 0), Some(&moved)), Some(Late::MovedPast));
        // Deliveries left, on a route that does not coalesce: a stale copy (the server
        // redelivered it since, and gave up on it), so it does not run.
        assert_eq!(late(&queued(1, 0), Some(&moved)), Some(Late::MovedPast));
        // On a coalescing route the next was let through by a skipped update's ack, not
        // given up on: it runs.
        let coalescing = Queued {
            coalescing: true,
            ..queued(1, 0)
        };
        assert_eq!(late(&coalescing, Some(&moved)), None);
        // Still the partition's latest: it runs.
        assert_eq!(late(&queued(1, 0), Some(&partition(7, 30, 100))), None);
    }

    #[test]
    fn the_consumers_own_bounds_decide_and_the_config_only_when_unread() {
        // The config says 4 deliveries and 30 s; the consumer says 100 and 60 s.
        let consumer = partition(7, 60, 100);
        assert_eq!(late(&queued(4, 29), Some(&consumer)), None);
        assert_eq!(late(&queued(100, 57), Some(&consumer)), None);
        assert_eq!(
            late(&queued(100, 58), Some(&consumer)),
            Some(Late::AckWaitSpent)
        );
        assert_eq!(late(&queued(4, 28), None), Some(Late::AckWaitSpent));
        assert_eq!(late(&queued(4, 27), None), None);
        assert_eq!(late(&queued(3, 60), None), None);
    }
}
