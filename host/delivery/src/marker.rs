//! The stranded-message marker around a message's last delivery: once the server delivers a
//! message no more, a marker says so until the delivery settles it (written before the work,
//! removed after it only if the delivery ended the message: acked or terminated it), in case
//! the host dies meanwhile and the advisory that would follow reaches no host. A sweep finds
//! what a marker names and dead-letters it unless it settled.
//!
//! The host writes markers to its claim bucket (its pipeline's `marked.rs`), the simulation
//! to its model: the seam is [`Marking`].

use std::future::Future;

/// One message's marker.
pub trait Marking: Sync {
    /// Writes the marker (a write that fails is reported: the advisory is then the message's
    /// way out).
    fn mark(&self) -> impl Future<Output = ()> + Send;

    /// Whether the delivery ended the message (acked or terminated it, not naked it).
    fn ended(&self) -> bool;

    /// Removes the marker: its message is out.
    fn forget(&self) -> impl Future<Output = ()> + Send;
}

/// Runs `work`, a delivery's handling, under `marker` when there is one (the delivery is the
/// server's last): marked before, forgotten after only if the delivery ended the message.
pub async fn around<M: Marking, F: Future>(marker: Option<&M>, work: F) -> F::Output {
    let marker =
        marker.filter(|_| !crate::revert::reverted(crate::revert::Fix::LastDeliveryMarker));
    if let Some(marker) = marker {
        marker.mark().await;
    }
    let out = work.await;
    let forgotten = |m: &&M| m.ended() || crate::revert::reverted(crate::revert::Fix::MarkerKept);
    if let Some(marker) = marker.filter(forgotten) {
        marker.forget().await;
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A marker whose delivery ends the message or not, logging its writes.
    struct Fake {
        ends: bool,
        log: Mutex<Vec<&'static str>>,
    }

    impl Marking for Fake {
        async fn mark(&self) {
            self.log.lock().expect("log").push("mark");
        }

        fn ended(&self) -> bool {
            self.ends
        }

        async fn forget(&self) {
            self.log.lock().expect("log").push("forget");
        }
    }

    fn fake(ends: bool) -> Fake {
        Fake {
            ends,
            log: Mutex::new(Vec::new()),
        }
    }

    #[tokio::test]
    async fn a_last_delivery_is_marked_before_its_work_and_forgotten_once_it_ended() {
        let m = fake(true);
        around(Some(&m), async { m.log.lock().expect("log").push("work") }).await;
        assert_eq!(*m.log.lock().unwrap(), ["mark", "work", "forget"]);
    }

    #[tokio::test]
    async fn a_marker_stays_when_the_delivery_did_not_end_the_message() {
        let m = fake(false);
        around(Some(&m), async { m.log.lock().expect("log").push("work") }).await;
        assert_eq!(*m.log.lock().unwrap(), ["mark", "work"]);
        around(None::<&Fake>, async {}).await;
    }
}
