//! Keeping a claim and its JetStream delivery alive while the guest works.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::message::Acker;
use async_nats::jetstream::AckKind;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument as _;

use crate::claim::{ClaimStore, Lease, LeaseLost};

/// A running heartbeat: every interval it renews the lease and sends a progress ack.
pub struct Heartbeat {
    stop: watch::Sender<bool>,
    lost: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl Heartbeat {
    /// Starts beating on the current (I/O) runtime, so guests burning the guest runtime's
    /// threads cannot delay it.
    pub fn start<S: ClaimStore>(
        lease: Arc<Lease<S>>,
        acker: Arc<Acker>,
        interval: Duration,
    ) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let (lost_tx, lost) = watch::channel(false);
        let beat = async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = stopped.changed() => return,
                }
                match lease.renew().await {
                    Ok(()) => {
                        if let Err(e) = acker.ack_with(AckKind::Progress).await {
                            tracing::warn!("progress ack failed: {e}");
                        }
                    }
                    Err(LeaseLost::Reclaimed) => {
                        let _ = lost_tx.send(true);
                        return;
                    }
                    Err(LeaseLost::Unavailable(e)) => {
                        tracing::warn!("lease renewal failed, will retry: {e}");
                    }
                }
            }
        };
        let task = tokio::spawn(beat.in_current_span());
        Self { stop, lost, task }
    }

    /// Resolves when the lease was found taken over.
    pub async fn lost(&mut self) {
        while !*self.lost.borrow() {
            if self.lost.changed().await.is_err() {
                // The task ended without losing the lease: wait forever.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Stops beating, letting a write in progress finish first.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
