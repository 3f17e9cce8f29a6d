//! Example handler: asks for a retry while `attempt` is below the route's `succeed_on_attempt`
//! config value (default 3), then succeeds with one output on `<subject>.done`. With the
//! config `outputs = N` it returns N outputs (payloads `<i>/<N> attempt <a> token <t>`), and
//! with `work_ms = M` it works that long first: tests of fenced commits and takeovers use
//! both.

wit_bindgen::generate!({
    path: "../../../wit",
    world: "handler-guest",
});

use dedup::handler::config;
use dedup::handler::log::{log, Level};
use dedup::handler::types::{Event, Failure, Output, RetryRequest};
use exports::dedup::handler::handler::Guest;

const DEFAULT_SUCCEED_ON_ATTEMPT: u32 = 3;

struct Flaky;

impl Guest for Flaky {
    fn handle(event: Event) -> Result<Vec<Output>, Failure> {
        let succeed_on = match config::get("succeed_on_attempt") {
            None => DEFAULT_SUCCEED_ON_ATTEMPT,
            Some(v) => v.trim().parse().map_err(|_| {
                Failure::Reject(format!("config `succeed_on_attempt` = `{v}` is not a whole number"))
            })?,
        };
        if event.attempt < succeed_on {
            log(
                Level::Warn,
                "simulated transient failure",
                &[("attempt".to_string(), event.attempt.to_string())],
            );
            return Err(Failure::Retry(RetryRequest {
                reason: format!("attempt {} of {succeed_on}: not yet", event.attempt),
                delay_ms: None,
            }));
        }
        if let Some(ms) = number("work_ms")? {
            std::thread::sleep(std::time::Duration::from_millis(ms.into()));
        }
        let Some(count) = number("outputs")? else {
            return Ok(vec![Output {
                subject: format!("{}.done", event.subject),
                payload: format!("succeeded on attempt {}", event.attempt).into_bytes(),
                headers: Vec::new(),
            }]);
        };
        Ok((0..count)
            .map(|i| Output {
                subject: format!("{}.done", event.subject),
                payload: format!(
                    "{i}/{count} attempt {} token {}",
                    event.attempt, event.fencing_token
                )
                .into_bytes(),
                headers: Vec::new(),
            })
            .collect())
    }
}

/// A whole-number config value, if set.
fn number(name: &str) -> Result<Option<u32>, Failure> {
    config::get(name)
        .map(|v| {
            v.trim()
                .parse()
                .map_err(|_| Failure::Reject(format!("config `{name}` = `{v}` is not a whole number")))
        })
        .transpose()
}

export!(Flaky);
