//! A small HTTP endpoint for the outbound-call tests, on a free loopback port: it records every
//! request (path, idempotency key, body) and answers by path:
//!
//! - `/hooks/...`: 201, body `ok <n>` (the n-th request with this idempotency key);
//! - `/redirect`: 302 to `/hooks/redirected` (a client that follows it shows up there);
//! - `/slow?ms=N`: waits N ms (after recording the request), then 200;
//! - `/big?bytes=N`: 200 with an N-byte body.
//!
//! [`Endpoint::start_tls`] serves the same over TLS (HTTP/1.1 over rustls) with a given
//! certificate.
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
    scheme: &'static str,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Endpoint {
    /// Starts it on `127.0.0.1:<free port>`.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a free port");
        let addr = listener.local_addr().expect("address");
        let (seen, app) = app();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("endpoint serves");
        });
        Self {
            addr,
            scheme: "http",
            seen,
            task,
        }
    }

    /// Starts it over TLS on `127.0.0.1:<free port>`, with the PEM certificate chain
    /// `cert_pem` and its PEM private key `key_pem`. A client that refuses the certificate
    /// is no request.
    pub async fn start_tls(cert_pem: &str, key_pem: &str) -> Self {
        use tokio_rustls::rustls;
        use tokio_rustls::rustls::pki_types::pem::PemObject as _;
        use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("a PEM certificate chain");
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("a PEM key");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("a usable certificate");
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a free port");
        let addr = tcp.local_addr().expect("address");
        let listener = TlsListener {
            tcp,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        };
        let (seen, app) = app();
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("endpoint serves");
        });
        Self {
            addr,
            scheme: "https",
            seen,
            task,
        }
    }

    /// `http://127.0.0.1:<port>` (`https://` over TLS).
    pub fn base(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
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

/// The endpoint's requests so far, and the app that records and answers them.
fn app() -> (Arc<Mutex<Vec<Seen>>>, axum::Router) {
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let state = seen.clone();
    let app = axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap, body: Bytes| {
        let seen = state.clone();
        async move { answer(&seen, uri, headers, body).await }
    });
    (seen, app)
}

/// A TCP listener whose connections are TLS; a failed handshake is skipped.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else {
                continue;
            };
            let handshake = self.acceptor.accept(stream);
            if let Ok(Ok(tls)) = tokio::time::timeout(Duration::from_secs(10), handshake).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
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
