//! Running one event through a handler in a fresh store.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::{Store, UpdateDeadline};

use super::outcome::{Invocation, Outcome, Trap, TrapKind};
use super::state::{GuestState, LogContext};
use super::Handler;
use crate::bindings::{Event, Failure, Output};
use crate::limits::Limits;

/// Per-route settings for an invocation.
#[derive(Debug, Clone, Default)]
pub struct InvokeOptions {
    /// Resource limits.
    pub limits: Limits,
    /// The route's configuration values, visible through the `config` import.
    pub config: Arc<BTreeMap<String, String>>,
}

impl Handler {
    /// Runs `event` in a fresh instance. Never fails: guest misbehaviour is an [`Outcome`].
    pub async fn invoke(&self, event: Event, options: &InvokeOptions) -> Invocation {
        let started = Instant::now();
        let context = LogContext {
            route: event.route.clone(),
            key: event.key.clone(),
            attempt: event.attempt,
        };
        let state = GuestState::new(options.config.clone(), options.limits.clone(), context);
        let mut store = Store::new(self.inner.pre.engine(), state);
        store.limiter(|state| state);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|mut ctx| {
            let state = ctx.data_mut();
            if Instant::now() >= state.deadline {
                let deadline = state.limits.deadline;
                return Err(state.breach(
                    TrapKind::Timeout,
                    format!("ran past its deadline of {}ms", deadline.as_millis()),
                ));
            }
            Ok(UpdateDeadline::Yield(1))
        });

        let result = match self.inner.pre.instantiate_async(&mut store).await {
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
            Ok(Ok(outputs)) => check_outputs(outputs, &options.limits),
            Ok(Err(Failure::Retry(r))) => Outcome::Retry {
                reason: r.reason,
                delay: r.delay_ms.map(Duration::from_millis),
            },
            Ok(Err(Failure::Reject(reason))) => Outcome::Reject { reason },
            Err(trap) => Outcome::Trap(trap),
        };
        let logs = std::mem::take(&mut store.data_mut().logs);
        Invocation {
            outcome,
            logs,
            elapsed: started.elapsed(),
        }
    }
}

/// Turns a wasmtime error into a trap, preferring the limit a host hook recorded.
fn classify(state: &mut GuestState, err: wasmtime::Error, default: TrapKind) -> Trap {
    if let Some((kind, message)) = state.breach.take() {
        return Trap { kind, message };
    }
    let kind = match err.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::StackOverflow) => TrapKind::StackOverflow,
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
    Trap { kind, message }
}

/// Enforces the output count and size limits.
fn check_outputs(outputs: Vec<Output>, limits: &Limits) -> Outcome {
    if outputs.len() > limits.max_outputs {
        return Outcome::Trap(Trap {
            kind: TrapKind::OutputLimit,
            message: format!(
                "returned {} outputs, over the limit of {}",
                outputs.len(),
                limits.max_outputs
            ),
        });
    }
    let bytes: u64 = outputs.iter().map(output_size).sum();
    if bytes > limits.max_output_bytes {
        return Outcome::Trap(Trap {
            kind: TrapKind::OutputLimit,
            message: format!(
                "returned {bytes} output bytes, over the limit of {}",
                limits.max_output_bytes
            ),
        });
    }
    Outcome::Success(outputs)
}

/// Bytes an output occupies on the wire, roughly: subject, payload and headers.
fn output_size(output: &Output) -> u64 {
    let headers: usize = output
        .headers
        .iter()
        .map(|h| h.name.len() + h.value.len())
        .sum();
    (output.subject.len() + output.payload.len() + headers) as u64
}
