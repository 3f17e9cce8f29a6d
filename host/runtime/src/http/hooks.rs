//! Where every outgoing request of a guest is seen, refused, replayed or sent
//! (`WasiHttpHooks::send_request`): the allowlist, the limits, the journal, the resolved
//! address check, then the host's client. A refusal is an HTTP error code the guest sees,
//! never a trap; what the journal stops (outcome unknown, non-determinism, a lost claim)
//! also decides the run's outcome ([`Verdict`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use wasmtime_wasi_http::{
    Error, ForbiddenHeaderFilter, RequestOptions, WasiBody, WasiHttpCtx, WasiHttpHooks,
    DEFAULT_FORBIDDEN_HEADERS,
};

use super::trace::{self, CallSpan};
use super::{allow, pool, resolve, send, CallResult, HttpGrant};
use dedup_delivery::journal::{
    Begin, CallRequest, Journal, JournalError, OnUnknown, RecordedResponse,
};

/// What the journal decided about the whole run, beyond the call the guest was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Dead-letter the message with this reason (outcome unknown, not deterministic).
    DeadLetter(String),
    /// The run may not finish (its claim was taken over, the journal did not answer): retry.
    Retry(String),
}

/// One invocation's HTTP state: wasmtime's context and the hooks.
pub struct HttpState {
    pub(crate) ctx: WasiHttpCtx,
    pub(crate) hooks: CallHooks,
}

impl HttpState {
    /// The state of a run of route `route`, key `key`, under `grant` (none: every call is
    /// refused), recording its calls in `journal` (none: local runs, nothing recorded).
    pub fn new(grant: Option<HttpGrant>, journal: Option<Journal>, route: &str, key: &str) -> Self {
        let claim_key = dedup_delivery::claim::key::encode(route, key);
        Self {
            ctx: WasiHttpCtx::new(),
            hooks: CallHooks {
                grant,
                journal,
                route: route.to_string(),
                claim_key,
                next_index: 0,
                verdict: Arc::default(),
                requests: Arc::default(),
            },
        }
    }

    /// The requests the guest made, in call order (method and URL; the body digest once the
    /// body was read): what a shadow run's comparison shows.
    pub fn requests(&self) -> Vec<CallRequest> {
        let requests = self.hooks.requests.lock().expect("requests");
        requests.values().cloned().collect()
    }

    /// What the journal decided about the run, if anything.
    pub fn verdict(&self) -> Option<Verdict> {
        self.hooks.verdict.lock().expect("verdict").clone()
    }
}

/// The hooks of one invocation.
pub struct CallHooks {
    grant: Option<HttpGrant>,
    journal: Option<Journal>,
    route: String,
    claim_key: String,
    /// The index the guest's next call gets (refused calls count too: a re-run of the same
    /// guest makes the same calls in the same order).
    next_index: u32,
    verdict: Arc<Mutex<Option<Verdict>>>,
    requests: Requests,
}

/// The requests of one invocation, by call index.
type Requests = Arc<Mutex<BTreeMap<u32, CallRequest>>>;

type ResponseFuture = Box<dyn Future<Output = Result<(), Error>> + Send>;

impl WasiHttpHooks for CallHooks {
    /// WASI's forbidden headers plus the idempotency header: the host sets it, a guest
    /// cannot (DESIGN.md rule 22).
    fn forbidden_header_filter(&mut self) -> ForbiddenHeaderFilter {
        let reserved = self.grant.as_ref().map(|g| g.header.clone());
        Arc::new(move |name| {
            DEFAULT_FORBIDDEN_HEADERS.contains(name) || reserved.as_ref() == Some(name)
        })
    }

    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        _options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> Box<dyn Future<Output = Result<(http::Response<WasiBody>, ResponseFuture), Error>> + Send>
    {
        let call = Call {
            index: self.next_index,
            grant: self.grant.clone(),
            journal: self.journal.clone(),
            route: self.route.clone(),
            claim_key: self.claim_key.clone(),
            verdict: self.verdict.clone(),
            requests: self.requests.clone(),
        };
        self.next_index += 1;
        Box::new(async move {
            let response = call.run(request).await?;
            Ok((response, Box::new(async { Ok(()) }) as ResponseFuture))
        })
    }
}

/// One call of a guest, with what it needs away from the store.
struct Call {
    index: u32,
    grant: Option<HttpGrant>,
    journal: Option<Journal>,
    route: String,
    claim_key: String,
    verdict: Arc<Mutex<Option<Verdict>>>,
    requests: Requests,
}

/// A refusal or failure: what the guest sees, and how it is counted.
type Refusal = (Error, CallResult);

impl Call {
    /// Runs the call; counts and logs how it ended.
    async fn run(
        self,
        request: http::Request<WasiBody>,
    ) -> Result<http::Response<WasiBody>, Error> {
        let (method, url) = (request.method().to_string(), request.uri().to_string());
        self.seen(CallRequest {
            method: method.to_ascii_uppercase(),
            url: url.clone(),
            body_digest: String::new(),
        });
        let uri = request.uri().clone();
        let (started, started_at) = (Instant::now(), SystemTime::now());
        let result = self.answer(request).await;
        let (outcome, status) = match &result {
            Ok((response, replayed)) => (
                if *replayed {
                    CallResult::Replayed
                } else {
                    CallResult::Sent
                },
                Some(response.status),
            ),
            Err((_, outcome)) => (*outcome, None),
        };
        if let Some(observer) = self.grant.as_ref().and_then(|g| g.observer.as_ref()) {
            observer(outcome);
        }
        let error = result.as_ref().err().map(|(e, _)| e.to_string());
        if let Some(tracer) = self.grant.as_ref().and_then(|g| g.tracer.as_ref()) {
            let (scheme, host, port) = target(&uri);
            tracer.record(CallSpan {
                index: self.index,
                method: method.to_ascii_uppercase(),
                url: trace::masked_url(&uri),
                scheme,
                host,
                port,
                result: outcome,
                status,
                error: result
                    .as_ref()
                    .err()
                    .map(|(e, _)| (trace::error_type(e), e.to_string())),
                started: started_at,
                ended: SystemTime::now(),
            });
        }
        tracing::info!(
            route = %self.route,
            call = self.index,
            %method,
            url = %dedup_delivery::redact::mask_url(&url),
            result = outcome.as_str(),
            status,
            error,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "outbound HTTP call"
        );
        result
            .map(|(response, _)| to_guest(response))
            .map_err(|(e, _)| e)
    }

    /// The answer (and whether it was replayed), or why not.
    async fn answer(
        &self,
        request: http::Request<WasiBody>,
    ) -> Result<(RecordedResponse, bool), Refusal> {
        let Some(grant) = &self.grant else {
            return Err((Error::HttpRequestDenied, CallResult::Denied));
        };
        if self.index >= grant.max_calls {
            return Err((Error::ConnectionLimitReached, CallResult::Limit));
        }
        let (parts, body) = request.into_parts();
        let uri = &parts.uri;
        let (scheme, host, port) = target(uri);
        let path = uri.path();
        let method = parts.method.as_str();
        let rule = grant
            .rules
            .iter()
            .find(|r| r.allows(method, &scheme, &host, port, path));
        if rule.is_none() && !grant.allow_any {
            return Err((Error::HttpRequestDenied, CallResult::Denied));
        }
        let deadline = tokio::time::Instant::now() + grant.timeout;
        let timed_out = || (Error::ConnectionTimeout, CallResult::Failed);
        let body = Limited::new(body, grant.max_request_bytes as usize).collect();
        let body = tokio::time::timeout_at(deadline, body)
            .await
            .map_err(|_| timed_out())?
            .map_err(|_| {
                let limit = Some(grant.max_request_bytes);
                (Error::HttpRequestBodySize(limit), CallResult::Limit)
            })?
            .to_bytes();
        let call = CallRequest::new(method, &uri.to_string(), &body);
        self.seen(call.clone());
        if let Some(responder) = &grant.responder {
            let answered = responder(&call).map(|response| (response, false));
            return answered.map_err(|why| (Error::InternalError(Some(why)), CallResult::Denied));
        }
        let rule = rule.ok_or((Error::HttpRequestDenied, CallResult::Denied))?;
        if let Some(journal) = &self.journal {
            match journal.begin(self.index, &call).await {
                Ok(Begin::Send) => {}
                Ok(Begin::Replay(response)) => return Ok((response, true)),
                Ok(Begin::Stop(reason)) => return Err(self.stop(Verdict::DeadLetter(reason))),
                Ok(Begin::Refuse(reason)) => {
                    tracing::debug!(route = %self.route, call = self.index, "{reason}");
                    return Err((Error::HttpRequestDenied, CallResult::Denied));
                }
                Err(e) => return Err(self.journal_failed(e)),
            }
        }
        let tls = match scheme.as_str() {
            "https" => {
                let missing = || {
                    let why = "no TLS client for an https rule".to_string();
                    (Error::InternalError(Some(why)), CallResult::Failed)
                };
                Some(grant.tls.as_ref().ok_or_else(missing)?)
            }
            _ => None,
        };
        // Every call resolves and checks its address; only then may a kept-alive connection
        // to that very address be reused.
        let connection = tokio::time::timeout_at(deadline, async {
            let addr = checked_address(rule, &host, port).await?;
            let key = pool::Key {
                scheme,
                host,
                port,
                addr,
            };
            // Kept-alive connections only where an unknown outcome is resent (see
            // `send::connect`).
            let pool = (grant.on_unknown == OnUnknown::Resend).then_some(&grant.pool);
            send::connect(pool, key, tls).await
        })
        .await
        .map_err(|_| timed_out())??;
        if let Some(journal) = &self.journal {
            if let Err(e) = journal.pending(self.index, &call, now_ms()).await {
                return Err(self.journal_failed(e));
            }
        }
        let key = match &self.journal {
            Some(journal) => journal.key_of(self.index),
            None => dedup_delivery::journal::idempotency_key(&self.claim_key, self.index),
        };
        let outgoing = outgoing(parts, body, &grant.header, &key)?;
        let response = tokio::time::timeout_at(
            deadline,
            connection.send(outgoing, grant.max_response_bytes),
        )
        .await
        .map_err(|_| (Error::HttpResponseTimeout, CallResult::Failed))??;
        if let Some(journal) = &self.journal {
            if let Err(e) = journal
                .sent(self.index, &call, response.clone(), now_ms())
                .await
            {
                return Err(self.journal_failed(e));
            }
        }
        Ok((response, false))
    }

    /// Notes the request the guest made at this call's index.
    fn seen(&self, request: CallRequest) {
        let mut requests = self.requests.lock().expect("requests");
        requests.insert(self.index, request);
    }

    /// Records `verdict` (the first one stands) and refuses the call.
    fn stop(&self, verdict: Verdict) -> Refusal {
        let message = match &verdict {
            Verdict::DeadLetter(reason) | Verdict::Retry(reason) => reason.clone(),
        };
        self.verdict.lock().expect("verdict").get_or_insert(verdict);
        (Error::InternalError(Some(message)), CallResult::Stopped)
    }

    fn journal_failed(&self, e: JournalError) -> Refusal {
        self.stop(Verdict::Retry(format!("outbound call {}: {e}", self.index)))
    }
}

/// A request's scheme (lower case), host (lower case, no brackets) and port (the scheme's
/// default when it names none).
fn target(uri: &http::Uri) -> (String, String, u16) {
    let scheme = uri.scheme_str().unwrap_or("http").to_ascii_lowercase();
    let host = uri.host().unwrap_or_default();
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    let port = uri.port_u16().unwrap_or(allow::default_port(&scheme));
    (scheme, host, port)
}

/// The one address of `host:port` the call connects to, refused when it is loopback or
/// private and `rule` does not name it explicitly.
async fn checked_address(
    rule: &allow::Rule,
    host: &str,
    port: u16,
) -> Result<std::net::SocketAddr, Refusal> {
    let addresses = resolve::addresses(host, port).await.map_err(|e| {
        let error = Error::DnsError {
            rcode: Some(e.to_string()),
            info_code: None,
        };
        (error, CallResult::Failed)
    })?;
    let first = addresses
        .first()
        .copied()
        .ok_or((Error::DestinationNotFound, CallResult::Failed))?;
    let prohibited = addresses.iter().any(|a| allow::is_private(a.ip()));
    if prohibited && !rule.names_private() {
        return Err((Error::DestinationIpProhibited, CallResult::Prohibited));
    }
    Ok(first)
}

/// The request as sent: the guest's method, path and headers, its body, and the idempotency
/// header set by the host.
fn outgoing(
    parts: http::request::Parts,
    body: Bytes,
    header: &http::HeaderName,
    key: &str,
) -> Result<http::Request<Full<Bytes>>, Refusal> {
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let mut request = http::Request::builder()
        .method(parts.method)
        .uri(path)
        .body(Full::new(body))
        .map_err(|e| {
            (
                Error::InternalError(Some(e.to_string())),
                CallResult::Failed,
            )
        })?;
    *request.headers_mut() = parts.headers;
    // HTTP/1.1 needs `Host` (a guest may not set it; hyper's connection does not add it).
    if let Some(authority) = parts.uri.authority() {
        let host = authority.as_str().rsplit('@').next().unwrap_or_default();
        if let Ok(value) = http::HeaderValue::from_str(host) {
            request.headers_mut().insert(http::header::HOST, value);
        }
    }
    let value = http::HeaderValue::from_str(key).map_err(|e| {
        (
            Error::InternalError(Some(e.to_string())),
            CallResult::Failed,
        )
    })?;
    request.headers_mut().insert(header.clone(), value);
    Ok(request)
}

/// A recorded answer as the guest receives it.
fn to_guest(response: RecordedResponse) -> http::Response<WasiBody> {
    let mut builder = http::Response::builder().status(response.status);
    for (name, value) in &response.headers {
        builder = builder.header(name, value);
    }
    let body = Full::new(Bytes::from(response.body))
        .map_err(|never| match never {})
        .boxed_unsync();
    builder.body(body).unwrap_or_else(|_| {
        let empty = Full::new(Bytes::new()).map_err(|never| match never {});
        http::Response::new(empty.boxed_unsync())
    })
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as u64
}
