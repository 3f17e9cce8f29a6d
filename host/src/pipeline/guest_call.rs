//! Running a guest call for the pipeline: in one of its route's guest slots, starting on the
//! calling thread when the route's guests have been short ([`InlineGate`]) and on the guest
//! threads otherwise, then letting a candidate observe or shadow it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use tracing::Instrument as _;

use super::Shared;
use crate::bindings::Event;
use crate::claim::ClaimStore;
use crate::routes::{Guest, Route};
use crate::runtime::inline::{InlineGate, LONG_SLICE};
use crate::runtime::Invocation;

impl<S: ClaimStore> Shared<S> {
    /// Runs `event` on `guest` in one of `route`'s guest slots. The guest's log lines carry
    /// the message's fields too; its outbound calls are recorded in `journal` and reported
    /// to `calls` (the message's trace; not a shadow's calls). Dropping the returned future
    /// aborts the call.
    pub(super) async fn call_guest(
        &self,
        route: &Route,
        guest: Guest,
        event: Event,
        journal: Option<dedup_delivery::journal::Journal>,
        calls: Option<crate::runtime::http::trace::CallTracer>,
    ) -> Result<Invocation, tokio::task::JoinError> {
        let (mut options, slots) = (route.options.clone(), route.slots.clone());
        options.journal = journal;
        let candidate = route.candidate();
        let shadow = candidate.clone().and_then(|c| {
            let free = route.slots.available_permits();
            (self.shadows).prepare(Some(c), free, &event, &route.metrics)
        });
        let live = match &guest {
            Guest::Wasm(h) => Some(h.clone()),
            Guest::Noop => None,
        };
        let digest = guest.digest().to_string();
        // The slot is waited for here, so that the call's first slice starts as soon as it
        // has one (a wait inside the call would move every call of a busy route).
        let slot = slots.acquire_owned().await.expect("guest slots open");
        let call = {
            let mut options = options.clone();
            if let Some(calls) = calls {
                options.http = options.http.map(|grant| grant.traced(calls));
            }
            async move {
                let _slot = slot;
                guest.invoke(event, &options).await
            }
        };
        let call = Box::pin(call.in_current_span());
        let called = self.run_call(call, &route.inline).await;
        if let (Ok(invocation), Some(c)) = (&called, &candidate) {
            c.observe(&digest, invocation, &route.metrics.rollout);
            if let Some(pending) = shadow {
                let metrics = route.metrics.clone();
                (self.shadows).run(pending, invocation, live, options, metrics);
            }
        }
        called
    }

    /// Runs `call` to its end: its first slice here when `gate` allows, the rest (or all of
    /// it) on the guest threads.
    async fn run_call<F>(
        &self,
        mut call: Pin<Box<F>>,
        gate: &InlineGate,
    ) -> Result<Invocation, tokio::task::JoinError>
    where
        F: Future<Output = Invocation> + Send + 'static,
    {
        if gate.allows() {
            // Its CPU time, not its wall time, decides: on a busy machine a 20 µs call is
            // often descheduled for longer than the limit (DESIGN.md rule 21).
            let (wall, cpu) = (Instant::now(), crate::cpu::thread_cpu());
            let polled = futures::poll!(call.as_mut());
            if wall.elapsed() >= LONG_SLICE {
                gate.ran(crate::cpu::thread_cpu().saturating_sub(cpu));
            }
            if let Poll::Ready(invocation) = polled {
                return Ok(invocation);
            }
        }
        GuestCall(self.guest_runtime.spawn(call)).await
    }
}

/// A guest call running on the guest threads; dropping it aborts the call (at the guest's
/// next yield), so work dropped because its lease was lost does not run on.
struct GuestCall(tokio::task::JoinHandle<Invocation>);

impl Future for GuestCall {
    type Output = Result<Invocation, tokio::task::JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx)
    }
}

impl Drop for GuestCall {
    fn drop(&mut self) {
        self.0.abort();
    }
}
