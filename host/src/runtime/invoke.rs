//! Running one event through a handler in a fresh store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use wasmtime::{CallHook, Store, UpdateDeadline};

use super::engine::FAST_SLICE;

use super::outcome::{Invocation, Outcome, Trap, TrapKind};
use super::outputs::check_outputs;
use super::state::{GuestState, InvokeOptions, LogContext};
use super::Handler;
use crate::bindings::{Event, Failure};
use crate::limits::Limits;
use crate::text;

impl Handler {
    /// Runs `event` in a fresh instance. Never fails: guest misbehaviour is an [`Outcome`].
    pub async fn invoke(&self, event: Event, options: &InvokeOptions) -> Invocation {
        let started = Instant::now();
        let context = LogContext {
            route: event.route.clone(),
            key: event.key.clone(),
            attempt: event.attempt,
        };
        let state = match GuestState::new(options, context) {
            Ok(state) => state,
            Err(e) => {
                let trap = Trap {
                    kind: TrapKind::Instantiate,
                    message: e.to_string(),
                };
                return Invocation {
                    outcome: Outcome::Trap(trap),
                    logs: Vec::new(),
                    elapsed: started.elapsed(),
                    instantiate: started.elapsed(),
                };
            }
        };
        let mut store = Store::new(self.inner.pre.engine(), state);
        if self.inner.metered {
            meter(&mut store, options, self.inner.lanes.clone());
        }
        let _running = self.inner.ticker.as_ref().map(|t| t.enter());

        let instantiated = self.inner.pre.instantiate_async(&mut store).await;
        let instantiate = started.elapsed();
        let result = match instantiated {
            Ok(bindings) => {
                let call = bindings
                    .dedup_handler_handler()
                    .call_handle(&mut store, &event)
                    .await;
                call.map_err(|e| classify(store.data_mut(), e, TrapKind::Guest))
            }
            Err(e) => Err(classify(store.data_mut(), e, TrapKind::Instantiate)),
        };
        let outcome = match result {
            Ok(Ok(outputs)) => check_outputs(outputs, options),
            Ok(Err(Failure::Retry(r))) => Outcome::Retry {
                reason: text::reason(&r.reason),
                delay: r.delay_ms.map(Duration::from_millis),
            },
            Ok(Err(Failure::Reject(reason))) => Outcome::Reject {
                reason: text::reason(&reason),
            },
            Err(trap) => Outcome::Trap(trap),
        };
        let logs = std::mem::take(&mut store.data_mut().logs);
        Invocation {
            outcome,
            logs,
            elapsed: started.elapsed(),
            instantiate,
        }
    }
}

impl Handler {
    /// Instantiates the component under `options`' limits without calling it, to refuse a
    /// version whose instance does not fit the route (initial memory, tables, instances) before
    /// it serves a message.
    pub async fn probe(&self, options: &InvokeOptions) -> Result<(), Trap> {
        let context = LogContext::default();
        let state = GuestState::new(options, context).map_err(|e| Trap {
            kind: TrapKind::Instantiate,
            message: e.to_string(),
        })?;
        let mut store = Store::new(self.inner.pre.engine(), state);
        if self.inner.metered {
            meter(&mut store, options, self.inner.lanes.clone());
        }
        let _running = self.inner.ticker.as_ref().map(|t| t.enter());
        match self.inner.pre.instantiate_async(&mut store).await {
            Ok(_) => Ok(()),
            Err(e) => Err(classify(store.data_mut(), e, TrapKind::Instantiate)),
        }
    }
}

/// Arms the limits: memory and table limiter, fuel, and the deadline checked at every epoch
/// tick. At each tick the guest yields to the executor; past [`FAST_SLICE`] it also gives
/// back its long-running lane and queues for one again (its route's, then the process's), so
/// long runners take turns. The deadline is wall-clock time, so waiting for a lane counts
/// against it: a guest that gets its lane past its deadline traps at that tick. A guest gives
/// its lane back whenever it calls into the host (a sleep, a poll), so a waiting guest never
/// holds one. (Timing out while still queued was measured to cost a neighbouring route a third
/// of its throughput beside a saturated looping route: the looping route then fails faster and
/// its dead letters and claim writes take the I/O.)
fn meter(store: &mut Store<GuestState>, options: &InvokeOptions, lanes: Arc<Semaphore>) {
    let limits: &Limits = &options.limits;
    store.limiter(|state| state);
    store
        .set_fuel(limits.fuel.unwrap_or(u64::MAX))
        .expect("the engine consumes fuel when metered");
    store.set_epoch_deadline(1);
    store.call_hook(|mut ctx, hook| {
        if matches!(hook, CallHook::CallingHost) {
            ctx.data_mut().lane.lock().expect("lane slot").clear();
        }
        Ok(())
    });
    let route_lanes = options.route_lanes.clone();
    store.epoch_deadline_callback(move |mut ctx| {
        let state = ctx.data_mut();
        if Instant::now() >= state.deadline {
            let deadline = state.limits.deadline;
            return Err(state.breach(
                TrapKind::Timeout,
                format!("ran past its deadline of {}ms", deadline.as_millis()),
            ));
        }
        if state.started.elapsed() < FAST_SLICE {
            return Ok(UpdateDeadline::Yield(1));
        }
        let slot = state.lane.clone();
        slot.lock().expect("lane slot").clear();
        let (lanes, route_lanes) = (lanes.clone(), route_lanes.clone());
        Ok(UpdateDeadline::YieldCustom(
            1,
            Box::pin(async move {
                tokio::task::yield_now().await;
                let acquire = async {
                    let mut held = Vec::with_capacity(2);
                    if let Some(route_lanes) = route_lanes {
                        held.push(route_lanes.acquire_owned().await.expect("lanes open"));
                    }
                    held.push(lanes.acquire_owned().await.expect("lanes open"));
                    held
                };
                *slot.lock().expect("lane slot") = acquire.await;
            }),
        ))
    });
}

/// Turns a wasmtime error into a trap, preferring the limit a host hook recorded.
fn classify(state: &mut GuestState, err: wasmtime::Error, default: TrapKind) -> Trap {
    if let Some((kind, message)) = state.breach.take() {
        return Trap { kind, message };
    }
    let kind = match err.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::StackOverflow) => TrapKind::StackOverflow,
        Some(wasmtime::Trap::OutOfFuel) => TrapKind::Fuel,
        _ if err
            .chain()
            .any(|e| e.is::<wasmtime::PoolConcurrencyLimitError>()) =>
        {
            TrapKind::PoolFull
        }
        _ => default,
    };
    let mut message = match err.downcast_ref::<wasmtime::Trap>() {
        Some(code) => code.to_string(),
        None => format!("{:#}", err),
    };
    let stderr = state.stderr_text();
    let stderr: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("note: run with `RUST_BACKTRACE"))
        .collect();
    if !stderr.is_empty() {
        message = format!("{message}; guest stderr: {}", stderr.join(" "));
    }
    Trap {
        kind,
        message: text::reason(&message),
    }
}
