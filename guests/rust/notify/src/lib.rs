//! The demo's notification handler: sends one notification to a provider over HTTP
//! (`wasi:http`, journaled by the host under the message's key), then writes the receipt,
//! which takes config `work_ms` (the demo kills the host meanwhile), and publishes it on
//! `<subject>.done` with the provider's answer.
//!
//! Payload: `{"user": "ada", "text": "your report is ready",
//! "provider": "http://127.0.0.1:8080/hooks/notify"}`.

wit_bindgen::generate!({
    path: "../../../wit",
    world: "handler-guest",
});

use dedup::handler::config;
use dedup::handler::types::{Event, Failure, Output, RetryRequest};
use exports::dedup::handler::handler::Guest;
use serde::{Deserialize, Serialize};
use wasip2::http::outgoing_handler;
use wasip2::http::types::{Fields, Method, OutgoingBody, OutgoingRequest, Scheme};

/// A notification to send.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Notification {
    user: String,
    text: String,
    #[serde(skip_serializing)]
    provider: String,
}

/// What is published once the provider has the notification.
#[derive(Serialize)]
struct Receipt<'a> {
    user: &'a str,
    /// The provider's answer: status and body.
    provider_status: u16,
    provider_answer: String,
    /// The run that wrote the receipt (2 after a crash: the answer is the first run's).
    attempt: u32,
}

struct Notify;

impl Guest for Notify {
    fn handle(event: Event) -> Result<Vec<Output>, Failure> {
        let n: Notification = serde_json::from_slice(&event.payload)
            .map_err(|e| Failure::Reject(format!("malformed notification: {e}")))?;
        let body = serde_json::to_vec(&n).expect("a notification serializes");
        let (status, answer) = post(&n.provider, &body).map_err(|reason| {
            // The provider is down or refused: try again later (the same idempotency key).
            Failure::Retry(RetryRequest { reason, delay_ms: Some(500) })
        })?;
        if let Some(ms) = config::get("work_ms").and_then(|ms| ms.parse::<u64>().ok()) {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        let receipt = Receipt {
            user: &n.user,
            provider_status: status,
            provider_answer: String::from_utf8_lossy(&answer).into_owned(),
            attempt: event.attempt,
        };
        Ok(vec![Output {
            subject: format!("{}.done", event.subject),
            payload: serde_json::to_vec(&receipt).expect("a receipt serializes"),
            headers: Vec::new(),
        }])
    }
}

/// POSTs `body` to `url` (`http://host:port/path`): the answer's status and body.
fn post(url: &str, body: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let rest = url.strip_prefix("http://").ok_or("the provider's url must start with http://")?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let request = OutgoingRequest::new(Fields::new());
    request.set_method(&Method::Post).map_err(|_| "method")?;
    request.set_scheme(Some(&Scheme::Http)).map_err(|_| "scheme")?;
    request.set_authority(Some(authority)).map_err(|_| "authority")?;
    request.set_path_with_query(Some(if path.is_empty() { "/" } else { path })).map_err(|_| "path")?;
    let outgoing = request.body().map_err(|_| "body")?;
    let answer = outgoing_handler::handle(request, None).map_err(|e| format!("{e:?}"))?;
    outgoing
        .write()
        .map_err(|_| "body stream")?
        .blocking_write_and_flush(body)
        .map_err(|e| format!("{e:?}"))?;
    OutgoingBody::finish(outgoing, None).map_err(|e| format!("{e:?}"))?;
    answer.subscribe().block();
    let response = answer.get().ok_or("no answer")?.map_err(|_| "answer taken")?;
    let response = response.map_err(|e| format!("the provider was not reached: {e:?}"))?;
    let status = response.status();
    let incoming = response.consume().map_err(|_| "answer body taken")?;
    let stream = incoming.stream().map_err(|_| "answer stream")?;
    let mut bytes = Vec::new();
    loop {
        match stream.blocking_read(64 * 1024) {
            Ok(chunk) => bytes.extend_from_slice(&chunk),
            Err(wasip2::io::streams::StreamError::Closed) => break,
            Err(e) => return Err(format!("reading the answer: {e:?}")),
        }
    }
    Ok((status, bytes))
}

export!(Notify);
