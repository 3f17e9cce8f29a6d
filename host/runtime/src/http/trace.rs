//! What the host's traces learn of each outbound call ([`CallSpan`]): the runtime reports
//! every call, sent, replayed or refused, once it has ended, and the host turns it into an
//! OTLP CLIENT span of the message's trace. The URL is reported with its secrets masked as
//! `inspect` shows them ([`masked_url`]).

use std::sync::Arc;
use std::time::SystemTime;

use wasmtime_wasi_http::Error;

use super::CallResult;

/// One call, as it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallSpan {
    /// The call's index in the run.
    pub index: u32,
    /// The request method, upper case.
    pub method: String,
    /// The URL, masked ([`masked_url`]).
    pub url: String,
    /// `http` or `https`.
    pub scheme: String,
    /// The URL's host.
    pub host: String,
    /// The URL's port (the scheme's default when it names none).
    pub port: u16,
    /// How the call ended.
    pub result: CallResult,
    /// The answer's status, when there is one (sent or replayed).
    pub status: Option<u16>,
    /// What went wrong, when the guest got no answer: the error code's name
    /// (`TlsCertificateError`, `HttpRequestDenied`) and its text.
    pub error: Option<(String, String)>,
    /// When the guest made the call.
    pub started: SystemTime,
    /// When its answer (or error) was ready.
    pub ended: SystemTime,
}

impl CallSpan {
    /// Whether the answer came from the journal, with nothing sent.
    pub fn replayed(&self) -> bool {
        self.result == CallResult::Replayed
    }
}

/// Where a run's calls are reported (the message's trace).
#[derive(Clone)]
pub struct CallTracer(Arc<dyn Fn(CallSpan) + Send + Sync>);

impl CallTracer {
    /// Reports each call to `record`.
    pub fn new(record: impl Fn(CallSpan) + Send + Sync + 'static) -> Self {
        Self(Arc::new(record))
    }

    /// Reports `span`.
    pub(crate) fn record(&self, span: CallSpan) {
        (self.0)(span)
    }
}

impl std::fmt::Debug for CallTracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallTracer")
    }
}

/// `uri` with its secrets masked ([`dedup_delivery::redact::mask_url`]): the credentials of
/// its user information, the values of query parameters named as secrets
/// (`https://user:pw@h/p?token=x&page=2` is `https://***@h/p?token=***&page=2`).
pub fn masked_url(uri: &http::Uri) -> String {
    dedup_delivery::redact::mask_url(&uri.to_string())
}

/// The name of an error code (`TlsCertificateError`), low in cardinality as `error.type`
/// asks.
pub fn error_type(error: &Error) -> String {
    let debug = format!("{error:?}");
    let end = debug
        .find(|c: char| !c.is_ascii_alphanumeric())
        .unwrap_or(debug.len());
    debug[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_masked_url_keeps_no_credentials_or_secret_parameters() {
        let uri: http::Uri = "https://user:secret@api.example.com:8443/v1/send?token=abc&page=2"
            .parse()
            .unwrap();
        assert_eq!(
            masked_url(&uri),
            "https://***@api.example.com:8443/v1/send?token=***&page=2"
        );
        let uri: http::Uri = "http://127.0.0.1/hooks/a".parse().unwrap();
        assert_eq!(masked_url(&uri), "http://127.0.0.1/hooks/a");
    }

    #[test]
    fn an_error_type_is_the_code_name() {
        assert_eq!(
            error_type(&Error::TlsCertificateError),
            "TlsCertificateError"
        );
        let dns = Error::DnsError {
            rcode: Some("x".into()),
            info_code: None,
        };
        assert_eq!(error_type(&dns), "DnsError");
    }
}
