//! The conformance guest in Rust, the baseline every language's conformance guest matches.
//!
//! The route's `mode` config value picks the behaviour:
//! - `upper` (default): log a line, output the payload upper-cased on `<subject>.done` with
//!   header `lang`;
//! - `reject`: reject a payload that is not a JSON object, echo one that is;
//! - `retry`: ask for a retry until attempt `succeed_on_attempt` (config, default 2), then
//!   output `succeeded on attempt N`.

wit_bindgen::generate!({
    path: "../../../wit",
    world: "handler-guest",
});

use dedup::handler::config::get;
use dedup::handler::log::{log, Level};
use dedup::handler::types::{Event, Failure, Header, Output, RetryRequest};
use exports::dedup::handler::handler::Guest;

const LANG: &str = "rust";

struct Conformance;

fn output(event: &Event, payload: Vec<u8>) -> Output {
    let headers = vec![Header { name: "lang".into(), value: LANG.into() }];
    Output { subject: format!("{}.done", event.subject), payload, headers }
}

impl Guest for Conformance {
    fn handle(event: Event) -> Result<Vec<Output>, Failure> {
        let mode = get("mode").unwrap_or_else(|| "upper".into());
        match mode.as_str() {
            "upper" => {
                log(Level::Info, "transforming", &[("bytes".into(), event.payload.len().to_string())]);
                Ok(vec![output(&event, event.payload.to_ascii_uppercase())])
            }
            "reject" => {
                if !event.payload.trim_ascii_start().starts_with(b"{") {
                    return Err(Failure::Reject("malformed: expected a JSON object".into()));
                }
                Ok(vec![output(&event, event.payload.clone())])
            }
            "retry" => {
                let wanted: u32 = get("succeed_on_attempt").and_then(|v| v.parse().ok()).unwrap_or(2);
                if event.attempt < wanted {
                    let reason = format!("attempt {} of {wanted}: not yet", event.attempt);
                    return Err(Failure::Retry(RetryRequest { reason, delay_ms: Some(10) }));
                }
                Ok(vec![output(&event, format!("succeeded on attempt {}", event.attempt).into_bytes())])
            }
            other => Err(Failure::Reject(format!("unknown mode `{other}`"))),
        }
    }
}

export!(Conformance);
