//! Running the `http-call` guest directly (no NATS): it makes the calls a message asks for
//! and reports what each got, under an HTTP grant whose calls' results are counted. Shared by
//! the outbound-HTTP tests (`http_effects`, `http_tls`).

use std::sync::{Arc, Mutex, OnceLock};

use dedup_host::bindings::Event;
use dedup_host::runtime::http::{CallResult, HttpConfig, HttpGrant};
use dedup_host::runtime::{EngineSettings, Handler, InvokeOptions, Outcome, Runtime};
use serde_json::{json, Value};

use crate::guests::guest;

/// The `http-call` guest, loaded once per test process.
pub fn http_call() -> Handler {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    let rt = RUNTIME.get_or_init(|| Runtime::new(&EngineSettings::default()).expect("runtime"));
    rt.load_file(&guest("http-call")).expect("load http-call")
}

/// The results of the calls a grant saw, in order.
pub type Results = Arc<Mutex<Vec<CallResult>>>;

/// The grant of `[routes.http]` text `text`, counting each call's result in `results`.
pub fn grant(text: &str, results: &Results) -> HttpGrant {
    let config: HttpConfig = toml::from_str(text).expect("http settings parse");
    let seen = results.clone();
    HttpGrant::new(&config)
        .expect("usable http settings")
        .observed(Arc::new(move |r| seen.lock().unwrap().push(r)))
}

/// Runs the guest making `calls` (as route `http`, key `k1`); what each call got.
pub async fn run(options: &InvokeOptions, calls: Value) -> Vec<Value> {
    let event = Event {
        subject: "in.http.k1".into(),
        payload: json!({ "calls": calls }).to_string().into_bytes(),
        headers: Vec::new(),
        key: "k1".into(),
        attempt: 1,
        fencing_token: 1,
        stream_sequence: 1,
        route: "http".into(),
    };
    match http_call().invoke(event, options).await.outcome {
        Outcome::Success(outputs) => serde_json::from_slice(&outputs[0].payload).unwrap(),
        other => panic!("the guest should report its calls, got {other:?}"),
    }
}

/// The error code a call's result names, if any (empty when it got an answer).
pub fn error(result: &Value) -> String {
    result["error"].as_str().unwrap_or_default().to_string()
}
