//! Outbound HTTP for guests of routes that grant it (`[routes.http]`): the standard
//! `wasi:http/outgoing-handler` import, linked only for components that import it and served
//! only on routes that grant it. Every request goes through [`hooks::CallHooks`]: the
//! allowlist ([`allow`]), the resolved-address check, the limits, the journal
//! ([`dedup_delivery::journal`]) and the host's own client ([`send`], over [`tls`] for
//! `https`, its keep-alive connections kept per route by [`pool`]). Each call is reported to
//! the host's traces ([`trace`]).
//!
//! - [`HttpConfig`]: the route's settings, as written in the config file.
//! - [`HttpGrant`]: the same, checked and parsed once per route.

pub mod allow;
pub mod hooks;
mod pool;
mod resolve;
mod send;
pub mod tls;
pub mod trace;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use dedup_delivery::journal::{CallRequest, OnUnknown, RecordedResponse};

/// Default bound on one call, connect to last byte of the answer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default most calls one run may make.
pub const DEFAULT_MAX_CALLS: u32 = 16;
/// Default largest request body.
pub const DEFAULT_MAX_REQUEST_BYTES: u64 = 1 << 20;
/// Default largest response body (what is journaled and replayed; the record holds it
/// hex-encoded, under NATS's default 1 MiB message size).
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 256 << 10;
/// The default header carrying each call's idempotency key.
pub const DEFAULT_IDEMPOTENCY_HEADER: &str = "Idempotency-Key";

/// One `allow` entry: a URL prefix, or a URL prefix with the methods it allows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum AllowEntry {
    /// `scheme://host[:port|:*][/path-prefix]`: any method.
    Url(String),
    /// The same, limited to some methods.
    WithMethods {
        /// `scheme://host[:port|:*][/path-prefix]`.
        url: String,
        /// Methods allowed (`["POST"]`).
        methods: Vec<String>,
    },
}

/// What a route's guests may call over HTTP, and the journal's policy. No `[routes.http]`:
/// no HTTP at all (a component importing `wasi:http` is refused).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Where calls may go: `"https://api.example.com"`, `"http://127.0.0.1:*/hooks/*"`, or
    /// `{ url = "...", methods = ["POST"] }`. Scheme (`https` or `http`, matched exactly),
    /// host (exactly), port (`*` for any; default 443 for `https`, 80 for `http`) and path
    /// prefix. Loopback and private addresses are reached only through a rule naming an IP
    /// literal or `localhost`, whatever a name resolves to.
    pub allow: Vec<AllowEntry>,
    /// A PEM file of CA certificates that `https` servers' certificates may also chain to,
    /// besides the system's roots (a private CA). Relative to the config file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Bound on one call, from connecting to the last byte of the answer.
    #[serde(default = "default_timeout", with = "crate::durations")]
    #[schemars(with = "crate::durations::Text")]
    pub timeout: Duration,
    /// Most calls one run of the handler may make; later ones are refused.
    #[serde(default = "default_max_calls")]
    #[schemars(range(min = 1))]
    pub max_calls: u32,
    /// Largest request body a call may send.
    #[serde(
        default = "default_max_request_bytes",
        deserialize_with = "crate::size::deserialize"
    )]
    #[schemars(with = "crate::size::Text")]
    pub max_request_bytes: u64,
    /// Largest response body a call may receive (it is journaled with the answer).
    #[serde(
        default = "default_max_response_bytes",
        deserialize_with = "crate::size::deserialize"
    )]
    #[schemars(with = "crate::size::Text")]
    pub max_response_bytes: u64,
    /// The header carrying each call's idempotency key (claim key + call index). The host
    /// sets it; a guest cannot.
    #[serde(default = "default_idempotency_header")]
    pub idempotency_header: String,
    /// A call an earlier run sent without recording its answer: `resend` it under the same
    /// idempotency key (at least once unless the provider deduplicates by it), or `fail` the
    /// message to the dead-letter subject (at most once).
    #[serde(default)]
    pub on_unknown: UnknownPolicy,
}

/// [`HttpConfig::on_unknown`].
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum UnknownPolicy {
    /// Send again under the same idempotency key.
    #[default]
    Resend,
    /// Dead-letter the message ("outcome unknown").
    Fail,
}

fn default_timeout() -> Duration {
    DEFAULT_TIMEOUT
}
fn default_max_calls() -> u32 {
    DEFAULT_MAX_CALLS
}
fn default_max_request_bytes() -> u64 {
    DEFAULT_MAX_REQUEST_BYTES
}
fn default_max_response_bytes() -> u64 {
    DEFAULT_MAX_RESPONSE_BYTES
}
fn default_idempotency_header() -> String {
    DEFAULT_IDEMPOTENCY_HEADER.to_string()
}

/// What HTTP does with header `name` when the protocol itself owns it (the host sets `Host`
/// and hyper the framing headers, so an idempotency key there would replace or be dropped);
/// `None` for a header of the application's.
fn reserved_header(name: &str) -> Option<&'static str> {
    let name = name.to_ascii_lowercase();
    match name.as_str() {
        "host" => Some("the host sets it to the URL's authority"),
        "content-length" | "transfer-encoding" | "te" | "trailer" => Some("it frames the message"),
        "connection" | "keep-alive" | "upgrade" | "proxy-connection" => {
            Some("it manages the connection")
        }
        _ if name.starts_with("proxy-") => Some("proxies read it"),
        _ => None,
    }
}

impl HttpConfig {
    /// Every problem with these settings, each naming the fix (empty when they are usable).
    pub fn problems(&self) -> Vec<String> {
        let mut problems: Vec<String> = self.rules().err().unwrap_or_default();
        if self.allow.is_empty() {
            problems.push(
                "`allow` is empty: name at least one endpoint, or remove `[routes.http]`".into(),
            );
        }
        if self.max_calls == 0 {
            problems.push("`max_calls` must be at least 1".into());
        }
        if self.timeout.is_zero() {
            problems.push("`timeout` must be more than zero".into());
        }
        if http::HeaderName::from_bytes(self.idempotency_header.as_bytes()).is_err() {
            problems.push(format!(
                "`idempotency_header` `{}` is not a valid header name",
                self.idempotency_header
            ));
        } else if let Some(taken) = reserved_header(&self.idempotency_header) {
            problems.push(format!(
                "`idempotency_header` `{}` is a header HTTP itself uses ({taken}): the key would replace it or be dropped; name a header of its own, such as the default `{DEFAULT_IDEMPOTENCY_HEADER}`",
                self.idempotency_header
            ));
        }
        problems
    }

    /// The parsed rules, or every entry's problem.
    fn rules(&self) -> Result<Vec<allow::Rule>, Vec<String>> {
        let (mut rules, mut problems) = (Vec::new(), Vec::new());
        for entry in &self.allow {
            let parsed = match entry {
                AllowEntry::Url(url) => allow::Rule::parse(url, &[]),
                AllowEntry::WithMethods { url, methods } => allow::Rule::parse(url, methods),
            };
            match parsed {
                Ok(rule) => rules.push(rule),
                Err(problem) => problems.push(format!("allow: {problem}")),
            }
        }
        match problems.is_empty() {
            true => Ok(rules),
            false => Err(problems),
        }
    }
}

/// How one call ended, as counted (`dedup_http_calls_total{route,result}`) and logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallResult {
    /// Sent, and its answer recorded.
    Sent,
    /// Answered from the journal of an earlier run; nothing sent.
    Replayed,
    /// Outside the allowlist.
    Denied,
    /// To a loopback or private address no rule names.
    Prohibited,
    /// Over a limit (calls, request or response bytes).
    Limit,
    /// Sent or tried, and it failed (connect, timeout, protocol).
    Failed,
    /// Stopped by the journal: outcome unknown, not deterministic, or the claim was lost.
    Stopped,
}

impl CallResult {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            CallResult::Sent => "sent",
            CallResult::Replayed => "replayed",
            CallResult::Denied => "denied",
            CallResult::Prohibited => "prohibited",
            CallResult::Limit => "limit",
            CallResult::Failed => "failed",
            CallResult::Stopped => "stopped",
        }
    }
}

/// Counts each call's result (the host's metrics).
pub type CallObserver = Arc<dyn Fn(CallResult) + Send + Sync>;

/// Answers calls instead of the network (`dedup-host test`'s canned responses): the answer
/// to a request, or why there is none (the guest sees it as an internal error).
pub type Responder = Arc<dyn Fn(&CallRequest) -> Result<RecordedResponse, String> + Send + Sync>;

/// A route's HTTP grant, checked once: its rules, limits and journal policy.
#[derive(Clone)]
pub struct HttpGrant {
    pub(crate) rules: Arc<[allow::Rule]>,
    pub(crate) timeout: Duration,
    pub(crate) max_calls: u32,
    pub(crate) max_request_bytes: u64,
    pub(crate) max_response_bytes: u64,
    pub(crate) header: http::HeaderName,
    pub(crate) on_unknown: OnUnknown,
    pub(crate) observer: Option<CallObserver>,
    /// Answers calls instead of the network: nothing is resolved, sent or journaled.
    pub(crate) responder: Option<Responder>,
    /// Every URL passes the allowlist (a grant made only for a responder).
    pub(crate) allow_any: bool,
    /// The TLS client settings, when a rule is `https`.
    pub(crate) tls: Option<Arc<tokio_rustls::rustls::ClientConfig>>,
    /// Where each call is reported as a span (set per message by the pipeline).
    pub(crate) tracer: Option<trace::CallTracer>,
    /// The route's idle keep-alive connections (each grant has its own: routes never share).
    pub(crate) pool: Arc<pool::Pool>,
}

impl HttpGrant {
    /// The grant of `config` (its `ca_file` read as given: resolve it first); every problem
    /// when it is not usable.
    pub fn new(config: &HttpConfig) -> Result<Self, Vec<String>> {
        let problems = config.problems();
        if !problems.is_empty() {
            return Err(problems);
        }
        let rules = config.rules()?;
        let tls = match rules.iter().any(|r| r.scheme == "https") {
            true => Some(
                tls::client_config(config.ca_file.as_deref())
                    .map_err(|e| vec![format!("ca_file: {e}")])?,
            ),
            false => None,
        };
        Ok(Self {
            rules: rules.into(),
            timeout: config.timeout,
            max_calls: config.max_calls,
            max_request_bytes: config.max_request_bytes,
            max_response_bytes: config.max_response_bytes,
            header: http::HeaderName::from_bytes(config.idempotency_header.as_bytes())
                .map_err(|e| vec![e.to_string()])?,
            on_unknown: match config.on_unknown {
                UnknownPolicy::Resend => OnUnknown::Resend,
                UnknownPolicy::Fail => OnUnknown::Fail,
            },
            observer: None,
            responder: None,
            allow_any: false,
            tls,
            tracer: None,
            pool: Arc::default(),
        })
    }

    /// A grant that answers every call with `responder`, whatever its URL (no allowlist;
    /// the default limits): for testing a handler with no route to test it as.
    pub fn answered_only(responder: Responder) -> Self {
        Self {
            rules: Arc::new([]),
            timeout: DEFAULT_TIMEOUT,
            max_calls: DEFAULT_MAX_CALLS,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            header: http::HeaderName::from_static("idempotency-key"),
            on_unknown: OnUnknown::Resend,
            observer: None,
            responder: Some(responder),
            allow_any: true,
            tls: None,
            tracer: None,
            pool: Arc::default(),
        }
    }

    /// The same grant (allowlist and limits still apply), its calls answered by `responder`
    /// instead of the network.
    pub fn answered_by(mut self, responder: Responder) -> Self {
        self.responder = Some(responder);
        self
    }

    /// Counts every call's result with `observer`.
    pub fn observed(mut self, observer: CallObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Reports every call to `tracer` (the message's trace).
    pub fn traced(mut self, tracer: trace::CallTracer) -> Self {
        self.tracer = Some(tracer);
        self
    }

    /// The journal policy for calls whose outcome is unknown.
    pub fn on_unknown(&self) -> OnUnknown {
        self.on_unknown
    }
}

impl std::fmt::Debug for HttpGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpGrant")
            .field("rules", &self.rules)
            .field("max_calls", &self.max_calls)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_header(name: &str) -> HttpConfig {
        serde_json::from_value(serde_json::json!({
            "allow": ["https://api.example.com"],
            "idempotency_header": name,
        }))
        .expect("a valid [routes.http]")
    }

    #[test]
    fn an_idempotency_header_http_itself_uses_is_refused_naming_it() {
        for name in [
            "Host",
            "content-length",
            "Transfer-Encoding",
            "Connection",
            "Proxy-Authorization",
        ] {
            let problems = with_header(name).problems();
            assert!(
                problems
                    .iter()
                    .any(|p| p.contains(&format!("`idempotency_header` `{name}`"))
                        && p.contains("Idempotency-Key")),
                "{name}: {problems:?}"
            );
        }
        for name in ["Idempotency-Key", "X-Request-Id"] {
            assert_eq!(with_header(name).problems(), Vec::<String>::new(), "{name}");
        }
    }
}
