//! Running one event through a handler in a fresh store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use wasmtime::{CallHook, Store, UpdateDeadline};

use super::engine::FAST_SLICE;

/// How long after its wall-clock limit a guest parked in a host call is ended; a computing
/// guest is ended at the first epoch tick past it.
const WALL_GRACE: Duration = Duration::from_millis(20);

use super::outcome::{Invocation, Outcome, Trap, TrapKind};
use super::outputs::check_outputs;
use super::state::{GuestState, InvokeOptions, LogContext};
use super::Handler;
use crate::bindings::{Event, Failure, HandlerGuestPre};
use crate::limits::Limits;
use dedup_delivery::text;

impl Handler {
    /// Runs `event` in a fresh instance. Never fails: guest misbehaviour is an [`Outcome`].
    /// The instance comes from the pool; when the pool is full (or the route allows more
    /// memory than a slot holds) it is made on demand instead, counted in
    /// [`super::pool_overflows`]. Nothing the first try did is kept: a guest's only effects
    /// are what it returns.
    pub async fn invoke(&self, event: Event, options: &InvokeOptions) -> Invocation {
        let mut first = None;
        if self.fits_pool(options.limits.memory_bytes) {
            let invocation = self.invoke_on(&self.inner.pre, &event, options).await;
            if !is_pool_full(&invocation.outcome) {
                return invocation;
            }
            first = Some(invocation);
        }
        match self.on_demand_pre() {
            Ok(pre) => {
                super::engine::count_overflow(self.name());
                self.invoke_on(pre, &event, options).await
            }
            Err(trap) => match first {
                Some(invocation) => invocation,
                None => Invocation {
                    outcome: Outcome::Trap(trap),
                    logs: Vec::new(),
                    elapsed: Duration::ZERO,
                    instantiate: Duration::ZERO,
                    fuel: None,
                    memory_bytes: 0,
                    calls: Vec::new(),
                },
            },
        }
    }

    /// Runs `event` in a fresh instance of `pre` (the pooled or the on-demand engine's).
    async fn invoke_on(
        &self,
        pre: &HandlerGuestPre<GuestState>,
        event: &Event,
        options: &InvokeOptions,
    ) -> Invocation {
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
                    fuel: None,
                    memory_bytes: 0,
                    calls: Vec::new(),
                };
            }
        };
        let mut store = Store::new(pre.engine(), state);
        if self.inner.metered {
            meter(&mut store, options, self.inner.lanes.clone());
        }
        let _running = self.inner.ticker.as_ref().map(|t| t.enter());

        // The epoch check ends a guest that computes past its limits; this timer ends one
        // parked in a host call (a sleep) past its wall-clock limit, a little later.
        let wall = tokio::time::Instant::from_std(store.data().wall_deadline) + WALL_GRACE;
        let mut instantiate = None;
        let run = async {
            let instantiated = pre.instantiate_async(&mut store).await;
            instantiate = Some(started.elapsed());
            match instantiated {
                Ok(bindings) => {
                    let call = bindings
                        .dedup_handler_handler()
                        .call_handle(&mut store, event)
                        .await;
                    call.map_err(|e| classify(store.data_mut(), e, TrapKind::Guest))
                }
                Err(e) => Err(classify(store.data_mut(), e, TrapKind::Instantiate)),
            }
        };
        let result = match tokio::time::timeout_at(wall, run).await {
            Ok(result) => result,
            Err(_) => {
                let state = store.data_mut();
                state.cpu_pause();
                let message = wall_message(state, state.cpu_used);
                Err(Trap {
                    kind: TrapKind::Timeout,
                    message,
                })
            }
        };
        let instantiate = instantiate.unwrap_or_else(|| started.elapsed());
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
        let outcome = journal_verdict(store.data(), outcome);
        let calls = (store.data().http.as_ref()).map_or_else(Vec::new, |h| h.requests());
        let logs = std::mem::take(&mut store.data_mut().logs);
        let fuel = match self.inner.metered {
            true => store
                .get_fuel()
                .ok()
                .map(|left| options.limits.fuel.unwrap_or(u64::MAX).saturating_sub(left)),
            false => None,
        };
        Invocation {
            outcome,
            logs,
            elapsed: started.elapsed(),
            instantiate,
            fuel,
            memory_bytes: store.data().memory_peak,
            calls,
        }
    }
}

impl Handler {
    /// Instantiates the component under `options`' limits without calling it, to refuse a
    /// version whose instance does not fit the route (initial memory, tables, instances) before
    /// it serves a message.
    pub async fn probe(&self, options: &InvokeOptions) -> Result<(), Trap> {
        if self.fits_pool(options.limits.memory_bytes) {
            match self.probe_on(&self.inner.pre, options).await {
                Err(trap) if trap.kind == TrapKind::PoolFull => {}
                done => return done,
            }
        }
        let pre = self.on_demand_pre()?;
        super::engine::count_overflow(self.name());
        self.probe_on(pre, options).await
    }

    /// Instantiates `pre` (the pooled or the on-demand engine's) without calling it.
    async fn probe_on(
        &self,
        pre: &HandlerGuestPre<GuestState>,
        options: &InvokeOptions,
    ) -> Result<(), Trap> {
        let context = LogContext::default();
        let state = GuestState::new(options, context).map_err(|e| Trap {
            kind: TrapKind::Instantiate,
            message: e.to_string(),
        })?;
        let mut store = Store::new(pre.engine(), state);
        if self.inner.metered {
            meter(&mut store, options, self.inner.lanes.clone());
        }
        let _running = self.inner.ticker.as_ref().map(|t| t.enter());
        match pre.instantiate_async(&mut store).await {
            Ok(_) => Ok(()),
            Err(e) => Err(classify(store.data_mut(), e, TrapKind::Instantiate)),
        }
    }
}

/// Arms the limits: memory and table limiter, fuel, and the deadlines checked at every epoch
/// tick. The deadline is CPU time (DESIGN.md rule 21): from its first tick on, the guest's
/// segments of execution are measured with the thread's CPU clock, paused across host calls
/// and suspensions (where the worker thread runs other tasks), so a busy machine or a wait for
/// a lane never counts against it. The wall-clock limit bounds everything else, a sleeping
/// guest included.
///
/// At each tick the guest yields to the executor; past [`FAST_SLICE`] it also gives back its
/// long-running lane and queues for one again (its route's, then the process's), so long
/// runners take turns. A guest gives its lane back whenever it calls into the host (a sleep,
/// a poll), so a waiting guest never holds one.
fn meter(store: &mut Store<GuestState>, options: &InvokeOptions, lanes: Arc<Semaphore>) {
    let limits: &Limits = &options.limits;
    store.limiter(|state| state);
    store
        .set_fuel(limits.fuel.unwrap_or(u64::MAX))
        .expect("the engine consumes fuel when metered");
    store.set_epoch_deadline(1);
    store.call_hook(|mut ctx, hook| {
        let state = ctx.data_mut();
        match hook {
            CallHook::CallingHost => {
                state.cpu_pause();
                state.lane.lock().expect("lane slot").clear();
            }
            CallHook::ReturningFromHost => state.cpu_resume(),
            _ => {}
        }
        Ok(())
    });
    let route_lanes = options.route_lanes.clone();
    store.epoch_deadline_callback(move |mut ctx| {
        let state = ctx.data_mut();
        let cpu = state.cpu_at_tick();
        if let Some(breach) = overrun(state, cpu) {
            return Err(breach);
        }
        let long_runner = state.started.elapsed() >= FAST_SLICE;
        let slot = state.lane.clone();
        let mark = state.cpu_mark.clone();
        if long_runner {
            slot.lock().expect("lane slot").clear();
        }
        let (lanes, route_lanes) = (lanes.clone(), route_lanes.clone());
        Ok(UpdateDeadline::YieldCustom(
            1,
            Box::pin(async move {
                tokio::task::yield_now().await;
                if long_runner {
                    let mut held = Vec::with_capacity(2);
                    if let Some(route_lanes) = route_lanes {
                        held.push(route_lanes.acquire_owned().await.expect("lanes open"));
                    }
                    held.push(lanes.acquire_owned().await.expect("lanes open"));
                    *slot.lock().expect("lane slot") = held;
                }
                // The guest goes on right after this, on the thread that polled it last.
                mark.set_now();
            }),
        ))
    });
}

/// The limit a guest at an epoch tick has run past, having used `cpu` of CPU time: its
/// deadline, or its wall-clock limit.
fn overrun(state: &mut GuestState, cpu: Duration) -> Option<wasmtime::Error> {
    let deadline = state.limits.deadline;
    if cpu >= deadline {
        let message = format!(
            "ran past its deadline of {}ms of CPU time",
            deadline.as_millis()
        );
        return Some(state.breach(TrapKind::Timeout, message));
    }
    if Instant::now() >= state.wall_deadline {
        let message = wall_message(state, cpu);
        return Some(state.breach(TrapKind::Timeout, message));
    }
    None
}

/// Why a guest that ran past its wall-clock limit having used `cpu` was ended.
fn wall_message(state: &GuestState, cpu: Duration) -> String {
    format!(
        "ran past its wall-clock limit of {}ms (limits.wall) having used {}ms of its {}ms CPU deadline: it waited (a sleep, a host call) or the machine was too busy to run it; raise limits.wall if that is expected",
        state.limits.wall_limit().as_millis(),
        cpu.as_millis(),
        state.limits.deadline.as_millis()
    )
}

/// The run's outcome once the call journal has had its say: a call whose outcome is unknown
/// (policy `fail`) or that differs from an earlier run's dead-letters the message, and a run
/// whose journal could not be written (a lost claim, an outage) is retried, whatever the
/// guest returned.
fn journal_verdict(state: &GuestState, outcome: Outcome) -> Outcome {
    use crate::http::hooks::Verdict;
    match state.http.as_ref().and_then(|h| h.verdict()) {
        Some(Verdict::DeadLetter(reason)) => Outcome::Reject {
            reason: text::reason(&reason),
        },
        Some(Verdict::Retry(reason)) => Outcome::Retry {
            reason: text::reason(&reason),
            delay: None,
        },
        None => outcome,
    }
}

/// Whether an invocation ended because the pool had no room (nothing of the guest ran to
/// completion: it is tried again outside the pool).
fn is_pool_full(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Trap(trap) if trap.kind == TrapKind::PoolFull)
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
