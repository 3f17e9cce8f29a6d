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

// Calling another system over HTTP (a notification, a payment API): the route must grant it
// (`[routes.http] allow = ["http://api.example.com/v1/"]`; without the grant a component
// that imports `wasi:http` is refused). Add `wasip2 = "1.0.4"` to Cargo.toml and uncomment.
// The host journals each call under the message's claim and sets its `Idempotency-Key`: a
// re-run of the key gets the recorded answer instead of calling again.
//
// /// POSTs `body` to `http://<authority><path>`; the answer's status.
// fn notify(authority: &str, path: &str, body: &[u8]) -> Result<u16, String> {
//     use wasip2::http::outgoing_handler;
//     use wasip2::http::types::{Fields, Method, OutgoingBody, OutgoingRequest, Scheme};
//     let request = OutgoingRequest::new(Fields::new());
//     request.set_method(&Method::Post).map_err(|_| "method")?;
//     request.set_scheme(Some(&Scheme::Http)).map_err(|_| "scheme")?;
//     request.set_authority(Some(authority)).map_err(|_| "authority")?;
//     request.set_path_with_query(Some(path)).map_err(|_| "path")?;
//     let outgoing = request.body().map_err(|_| "body")?;
//     let answer = outgoing_handler::handle(request, None).map_err(|e| format!("{e:?}"))?;
//     outgoing.write().map_err(|_| "body stream")?.blocking_write_and_flush(body)
//         .map_err(|e| format!("{e:?}"))?; // (bodies over 4 KiB: write in chunks)
//     OutgoingBody::finish(outgoing, None).map_err(|e| format!("{e:?}"))?;
//     answer.subscribe().block();
//     let response = answer.get().ok_or("no answer")?.map_err(|_| "taken")?;
//     Ok(response.map_err(|e| format!("{e:?}"))?.status()) // an error code: denied, timeout, ...
// }
