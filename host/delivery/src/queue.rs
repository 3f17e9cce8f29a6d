//! An exclusive route's source message, queued (`exclusive_by`): the route's consumer hands
//! its messages to one pinned host, the copier ([`crate::copier`]); each is copied onto its
//! entity's partition of the work queue and only then acked, so the queue holds each entity's
//! messages in source order and no message is acked before its copy is stored. A copy refused
//! for now is naked with the outage backoff, one this host may not make (another host is the
//! copier) is handed back at once; a message with no entity key, or one that can never be
//! stored, is dead-lettered.
//!
//! The host runs [`queue`] over JetStream (its pipeline's `queue.rs`), the simulation over
//! its model: the seam is [`Queueing`].

use std::future::Future;
use std::time::Duration;

use crate::outcome::MessageOutcome;
use crate::revert::{reverted, Fix};
use crate::settle::Settlement;

/// Why a message's copy onto the work queue was not stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyRefused {
    /// It can never be stored (larger than the server accepts): dead-letter it, for this
    /// reason.
    ForGood(String),
    /// The work queue did not answer, or refused for now: queue it again later.
    Transient(String),
    /// Another host is the route's copier: hand the message back for it, soon and without
    /// counting an outage (a long nak would hold the consumer's ack floor back).
    NotCopier(String),
}

/// How long a delivery this host may not copy waits before the server hands it out again
/// (to the pinned copier): short, not zero, so that hosts disagreeing about the pin for a
/// moment do not spend the message's deliveries in a loop.
pub const HANDED_BACK: Duration = Duration::from_millis(500);

/// One delivery of an exclusive route's source consumer, with the I/O queueing it needs.
pub trait Queueing: Sync {
    /// The message's entity key; an error says why it has none.
    fn entity(&self) -> Result<String, String>;

    /// Copies the message onto `entity`'s partition of the work queue (deduplicated by its
    /// source sequence, so a redelivery queued again is dropped).
    fn copy(&self, entity: &str) -> impl Future<Output = Result<(), CopyRefused>> + Send;

    /// Hands the delivery back to the server (an ack is plain: a lost one only means a
    /// redelivery, queued again and dropped).
    fn settle(&self, how: Settlement) -> impl Future<Output = ()> + Send;

    /// Counts how the delivery ended; an [`MessageOutcome::Error`] lengthens the outage
    /// backoff of the next [`Queueing::outage_delay`].
    fn count(&self, outcome: MessageOutcome);

    /// The nak delay after an infrastructure error already counted (the outage backoff).
    fn outage_delay(&self) -> Duration;

    /// Dead-letters the message, never queued, for `reason`, and settles it.
    fn dead_letter(&self, reason: &str) -> impl Future<Output = ()> + Send;
}

/// Whether the queue stage marks a source message's last delivery around its work
/// ([`crate::marker::around`]): always, so
/// that a message the server gave up on is lettered though its advisory reached no host
/// (issue 42, finding 10). `false` only with [`Fix::QueueStageMarker`] reverted (test-only).
pub fn marks_last_delivery() -> bool {
    !reverted(Fix::QueueStageMarker)
}

/// Queues delivery `q`: copy onto its entity's partition, then ack.
pub async fn queue<Q: Queueing>(q: &Q) {
    let entity = match q.entity() {
        Ok(entity) => entity,
        Err(missing) => {
            let reason = format!("no entity key (exclusive_by): {missing}");
            return q.dead_letter(&reason).await;
        }
    };
    // Reverted (test-only): acked before the copy is stored, the order before the fix.
    let acked = crate::revert::reverted(crate::revert::Fix::QueueAckOrder);
    if acked {
        q.settle(Settlement::Ack).await;
    }
    match q.copy(&entity).await {
        Ok(()) if acked => {}
        // Stored: only now may the source forget it.
        Ok(()) => q.settle(Settlement::Ack).await,
        Err(CopyRefused::ForGood(reason)) => q.dead_letter(&reason).await,
        Err(CopyRefused::Transient(_)) => {
            q.count(MessageOutcome::Error);
            q.settle(Settlement::Nak(q.outage_delay())).await
        }
        Err(CopyRefused::NotCopier(_)) => q.settle(Settlement::Nak(HANDED_BACK)).await,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A delivery whose copy is answered `copied`, logging its I/O.
    struct Fake {
        entity: Result<String, String>,
        copied: Result<(), CopyRefused>,
        log: Mutex<Vec<String>>,
    }

    impl Fake {
        fn new(copied: Result<(), CopyRefused>) -> Self {
            Self {
                entity: Ok("e1".into()),
                copied,
                log: Mutex::new(Vec::new()),
            }
        }

        fn note(&self, line: String) {
            self.log.lock().expect("log").push(line);
        }

        fn lines(&self) -> Vec<String> {
            self.log.lock().expect("log").clone()
        }
    }

    impl Queueing for Fake {
        fn entity(&self) -> Result<String, String> {
            self.entity.clone()
        }

        async fn copy(&self, entity: &str) -> Result<(), CopyRefused> {
            self.note(format!("copy {entity}"));
            self.copied.clone()
        }

        async fn settle(&self, how: Settlement) {
            self.note(format!("settle {how:?}"));
        }

        fn count(&self, outcome: MessageOutcome) {
            self.note(format!("count {outcome:?}"));
        }

        fn outage_delay(&self) -> Duration {
            Duration::from_secs(5)
        }

        async fn dead_letter(&self, reason: &str) {
            self.note(format!("dead letter: {reason}"));
        }
    }

    #[tokio::test]
    async fn a_message_is_acked_only_after_its_copy_is_stored() {
        let q = Fake::new(Ok(()));
        queue(&q).await;
        assert_eq!(q.lines(), ["copy e1", "settle Ack"]);
    }

    #[tokio::test]
    async fn a_copy_refused_for_now_is_naked_with_the_outage_backoff() {
        let q = Fake::new(Err(CopyRefused::Transient("no answer".into())));
        queue(&q).await;
        assert_eq!(q.lines(), ["copy e1", "count Error", "settle Nak(5s)"]);
    }

    #[tokio::test]
    async fn a_copy_another_host_must_make_is_handed_back_soon_and_counts_no_outage() {
        let q = Fake::new(Err(CopyRefused::NotCopier("pinned elsewhere".into())));
        queue(&q).await;
        assert_eq!(q.lines(), ["copy e1", "settle Nak(500ms)"]);
    }

    #[tokio::test]
    async fn a_message_that_cannot_be_queued_is_dead_lettered() {
        let q = Fake::new(Err(CopyRefused::ForGood("too big".into())));
        queue(&q).await;
        assert_eq!(q.lines(), ["copy e1", "dead letter: too big"]);
        let mut q = Fake::new(Ok(()));
        q.entity = Err("no header `Entity`".into());
        queue(&q).await;
        assert_eq!(
            q.lines(),
            ["dead letter: no entity key (exclusive_by): no header `Entity`"]
        );
    }
}
