//! Time as the delivery logic sees it: a sleep, passed in. The host sleeps on tokio's timer
//! ([`Tokio`]); the simulation on its virtual clock, so a heartbeat's beats and a lease's
//! lapse happen in the simulated time the model's server answers in.

use std::future::Future;
use std::time::Duration;

/// Waiting for time to pass.
pub trait Clock: Sync {
    /// Completes once `duration` has passed.
    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + Send;

    /// Runs `work` for at most `limit`: `None` once the limit passed first (and `work` is
    /// dropped at its await point).
    fn timeout<F: Future + Send>(
        &self,
        limit: Duration,
        work: F,
    ) -> impl Future<Output = Option<F::Output>> + Send {
        async move {
            tokio::select! {
                biased;
                out = work => Some(out),
                () = self.sleep(limit) => None,
            }
        }
    }
}

/// The host's clock: tokio's timer.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tokio;

impl Clock for Tokio {
    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(duration)
    }

    async fn timeout<F: Future + Send>(&self, limit: Duration, work: F) -> Option<F::Output> {
        tokio::time::timeout(limit, work).await.ok()
    }
}
