//! A small HTTP endpoint for the outbound-call tests, on a free loopback port: it records every
//! request (path, idempotency key, body) and answers by path:
//!
//! - `/hooks/...`: 201, body `ok <n>` (the n-th request with this idempotency key);
//! - `/redirect`: 302 to `/hooks/redirected` (a client that follows it shows up there);
//! - `/slow?ms=N`: waits N ms (after recording the request), then 200;
//! - `/big?bytes=N`: 200 with an N-byte body.
//!
//! Any path also takes `delay_ms=N`: the answer waits N ms (after recording the request), for
//! every request, or with `delay_first=K` only for the first K requests of its idempotency
//! key (a provider slow once, then quick).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

/// One request as the endpoint saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The request path.
    pub path: String,
    /// Its `Idempotency-Key` header, if any.
    pub key: Option<String>,
    /// Its body, as text.
    pub body: String,
}

/// The running endpoint; stops when dropped.
pub struct Endpoint {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Endpoint {
    /// Starts it on `127.0.0.1:<free port>`.
    pub async fn start() -> Self {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let state = seen.clone();
        let app = axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap, body: Bytes| {
            let seen = state.clone();
            async move { answer(&seen, uri, headers, body).await }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a free port");
        let addr = listener.local_addr().expect("address");
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("endpoint serves");
        });
        Self { addr, seen, task }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// How many requests carried each idempotency key.
    pub fn per_key(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for s in self.seen() {
            *counts.entry(s.key.unwrap_or_default()).or_insert(0) += 1;
        }
        counts
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(seen: &Mutex<Vec<Seen>>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let path = uri.path().to_string();
    let n = {
        let mut seen = seen.lock().unwrap();
        seen.push(Seen {
            path: path.clone(),
            key: key.clone(),
            body: String::from_utf8_lossy(&body).into_owned(),
        });
        seen.iter().filter(|s| s.key == key).count()
    };
    let query = |name: &str| -> u64 {
        uri.query()
            .unwrap_or_default()
            .split('&')
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let (delay, first) = (query("delay_ms"), query("delay_first"));
    if delay > 0 && (first == 0 || n as u64 <= first) {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    match path.as_str() {
        "/redirect" => (StatusCode::FOUND, [("location", "/hooks/redirected")], "").into_response(),
        "/slow" => {
            tokio::time::sleep(Duration::from_millis(query("ms"))).await;
            (StatusCode::OK, format!("slow {n}")).into_response()
        }
        "/big" => (StatusCode::OK, "x".repeat(query("bytes") as usize)).into_response(),
        p if p.starts_with("/hooks/") => (StatusCode::CREATED, format!("ok {n}")).into_response(),
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}
