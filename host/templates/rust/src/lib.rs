//! {{name}}: a dedup-host handler. A JSON object payload is greeted onto `<subject>.done`;
//! anything else is rejected.

wit_bindgen::generate!({
    path: "wit",
    world: "handler-guest",
});

use dedup::handler::config::get;
use dedup::handler::log::{log, Level};
use dedup::handler::types::{Event, Failure, Header, Output};
use exports::dedup::handler::handler::Guest;
use serde_json::{json, Map, Value};

struct Handler;

impl Guest for Handler {
    fn handle(event: Event) -> Result<Vec<Output>, Failure> {
        // Input that will never work is rejected: dead-lettered, not retried.
        let body: Map<String, Value> = serde_json::from_slice(&event.payload)
            .map_err(|e| Failure::Reject(format!("malformed: expected a JSON object ({e})")))?;
        let greeting = get("greeting").unwrap_or_else(|| "hello".into());
        log(
            Level::Info,
            "greeting",
            &[("key".into(), event.key.clone()), ("greeting".into(), greeting.clone())],
        );
        let payload = json!({ "greeting": greeting, "key": event.key, "event": body });
        Ok(vec![Output {
            subject: format!("{}.done", event.subject),
            payload: payload.to_string().into_bytes(),
            headers: vec![Header { name: "content-type".into(), value: "application/json".into() }],
        }])
    }
}

export!(Handler);
