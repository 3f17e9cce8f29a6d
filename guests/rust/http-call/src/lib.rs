//! Test handler for outbound HTTP: makes the calls its payload lists (`wasi:http`), then
//! publishes what each one got, status and body or the error code, on `<subject>.done`.
//!
//! Payload: `{"calls": [{"url": "http://127.0.0.1:8080/hooks/a", "method": "POST",
//! "body": "hi", "headers": [["x-a", "1"]], "attempt_in_body": false}], "retry_on_error": false,
//! "retry_first_attempt": false}`.

wit_bindgen::generate!({
    path: "../../../wit",
    world: "handler-guest",
});

use dedup::handler::types::{Event, Failure, Output, RetryRequest};
use exports::dedup::handler::handler::Guest;
use serde::{Deserialize, Serialize};
use wasip2::http::outgoing_handler;
use wasip2::http::types::{Fields, Method, OutgoingBody, OutgoingRequest, Scheme};

#[derive(Deserialize)]
struct Input {
    calls: Vec<CallSpec>,
    /// Ask for a retry when a call fails (instead of reporting it).
    #[serde(default)]
    retry_on_error: bool,
    /// Make the calls, then ask for a retry on attempt 1 (the re-run replays the calls).
    #[serde(default)]
    retry_first_attempt: bool,
}

#[derive(Deserialize)]
struct CallSpec {
    url: String,
    #[serde(default = "post")]
    method: String,
    #[serde(default)]
    body: String,
    #[serde(default)]
    headers: Vec<(String, String)>,
    /// Append `#<attempt>` to the body: a handler that is not deterministic.
    #[serde(default)]
    attempt_in_body: bool,
}

fn post() -> String {
    "POST".into()
}

#[derive(Serialize)]
struct CallResult {
    status: Option<u16>,
    body: Option<String>,
    error: Option<String>,
}

struct HttpCall;

impl Guest for HttpCall {
    fn handle(event: Event) -> Result<Vec<Output>, Failure> {
        let input: Input = serde_json::from_slice(&event.payload)
            .map_err(|e| Failure::Reject(format!("payload is not a call list: {e}")))?;
        let mut results = Vec::new();
        for spec in &input.calls {
            let mut body = spec.body.clone();
            if spec.attempt_in_body {
                body = format!("{body}#{}", event.attempt);
            }
            let result = match call(spec, body.as_bytes()) {
                Ok((status, body)) => CallResult {
                    status: Some(status),
                    body: Some(String::from_utf8_lossy(&body).into_owned()),
                    error: None,
                },
                Err(error) if input.retry_on_error => {
                    return Err(Failure::Retry(RetryRequest {
                        reason: error,
                        delay_ms: Some(100),
                    }))
                }
                Err(error) => CallResult {
                    status: None,
                    body: None,
                    error: Some(error),
                },
            };
            results.push(result);
        }
        if input.retry_first_attempt && event.attempt == 1 {
            return Err(Failure::Retry(RetryRequest {
                reason: "first attempt: retried on purpose".into(),
                delay_ms: Some(100),
            }));
        }
        Ok(vec![Output {
            subject: format!("{}.done", event.subject),
            payload: serde_json::to_vec(&results).expect("results serialize"),
            headers: Vec::new(),
        }])
    }
}

/// One call: its status and body, or what went wrong.
fn call(spec: &CallSpec, body: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let (scheme, rest) = spec.url.split_once("://").ok_or("url has no scheme")?;
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    let headers: Vec<(String, Vec<u8>)> = spec
        .headers
        .iter()
        .map(|(n, v)| (n.clone(), v.clone().into_bytes()))
        .collect();
    let fields = Fields::from_list(&headers).map_err(|e| format!("header: {e:?}"))?;
    let request = OutgoingRequest::new(fields);
    let method = match spec.method.to_ascii_uppercase().as_str() {
        "GET" => Method::Get,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        other => Method::Other(other.to_string()),
    };
    request.set_method(&method).map_err(|_| "method")?;
    let scheme = match scheme {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        other => Scheme::Other(other.to_string()),
    };
    request.set_scheme(Some(&scheme)).map_err(|_| "scheme")?;
    request.set_authority(Some(authority)).map_err(|_| "authority")?;
    request.set_path_with_query(Some(path)).map_err(|_| "path")?;
    let outgoing = request.body().map_err(|_| "body taken")?;
    let future = outgoing_handler::handle(request, None).map_err(|e| format!("{e:?}"))?;
    // A body the host refuses (too big) may fail to write: the response's error says why.
    let written = write_body(outgoing, body);
    future.subscribe().block();
    let response = future
        .get()
        .ok_or("no response after the wait")?
        .map_err(|_| "response taken twice")?
        .map_err(|e| format!("{e:?}"))?;
    written?;
    let status = response.status();
    let incoming = response.consume().map_err(|_| "response body taken")?;
    let mut bytes = Vec::new();
    {
        let stream = incoming.stream().map_err(|_| "response stream")?;
        loop {
            match stream.blocking_read(64 * 1024) {
                Ok(chunk) => bytes.extend_from_slice(&chunk),
                Err(wasip2::io::streams::StreamError::Closed) => break,
                Err(e) => return Err(format!("reading the response: {e:?}")),
            }
        }
    }
    Ok((status, bytes))
}

/// Writes `body` and finishes the request.
fn write_body(outgoing: OutgoingBody, body: &[u8]) -> Result<(), String> {
    {
        let stream = outgoing.write().map_err(|_| "body stream")?;
        for chunk in body.chunks(4096) {
            stream
                .blocking_write_and_flush(chunk)
                .map_err(|e| format!("writing the body: {e:?}"))?;
        }
    }
    OutgoingBody::finish(outgoing, None).map_err(|e| format!("{e:?}"))
}

export!(HttpCall);
