//! Canned answers to a handler's outbound HTTP calls in `dedup-host test` cases, so a handler
//! that calls out is tested without a network: `[[cases.http]]` answers in every case,
//! `[[case.http]]` in one case (tried first). A call no entry matches fails its case, naming
//! the call and the entry to add. Nothing is sent, resolved or journaled.
//!
//! ```toml
//! [[cases.http]]
//! method = "POST"                                   # any method when absent
//! url = "http://notifications.internal/v1/send"     # the request's URL, exactly
//! status = 201                                      # [200]
//! headers = { content-type = "application/json" }
//! body = '{"id": "n-1"}'                            # [""]
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::Deserialize;

use crate::runtime::http::{HttpGrant, Responder};
use dedup_delivery::journal::{CallRequest, RecordedResponse};

/// One canned answer, for calls with this method and URL.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CannedResponse {
    /// The method it answers (any when absent).
    pub method: Option<String>,
    /// The URL it answers, exactly as the handler calls it (`http://host:port/path?query`).
    pub url: String,
    /// The answer's status.
    #[serde(default = "ok")]
    pub status: u16,
    /// The answer's headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The answer's body, as text.
    #[serde(default)]
    pub body: String,
}

fn ok() -> u16 {
    200
}

impl CannedResponse {
    /// What is wrong with this entry, naming the fix.
    pub fn problem(&self) -> Option<String> {
        if !self.url.contains("://") {
            return Some(format!(
                "http: url `{}` has no scheme: write the full URL the handler calls (`http://host/path`)",
                self.url
            ));
        }
        if !(100..=599).contains(&self.status) {
            return Some(format!(
                "http: `{}` status {} is not an HTTP status (100 to 599)",
                self.url, self.status
            ));
        }
        None
    }

    fn answers(&self, call: &CallRequest) -> bool {
        let method = self.method.as_deref();
        call.url == self.url && method.is_none_or(|m| m.eq_ignore_ascii_case(&call.method))
    }

    fn response(&self) -> RecordedResponse {
        RecordedResponse {
            status: self.status,
            headers: self.headers.clone().into_iter().collect(),
            body: self.body.clone().into_bytes(),
        }
    }
}

/// The canned answers of one case's run, and the calls none of them matched.
pub struct Answers {
    canned: Arc<Vec<CannedResponse>>,
    unmatched: Arc<Mutex<Vec<CallRequest>>>,
}

impl Answers {
    /// The case's own entries, then the file's.
    pub fn new(case: &[CannedResponse], shared: &[CannedResponse]) -> Self {
        let canned = case.iter().chain(shared).cloned().collect();
        Self {
            canned: Arc::new(canned),
            unmatched: Arc::default(),
        }
    }

    /// `route`'s grant (its allowlist and limits still apply) or, with no route, a grant for
    /// any URL, either answered from these entries instead of the network.
    pub fn grant(&self, route: Option<HttpGrant>) -> HttpGrant {
        let (canned, unmatched) = (self.canned.clone(), self.unmatched.clone());
        let responder: Responder =
            Arc::new(
                move |call: &CallRequest| match canned.iter().find(|c| c.answers(call)) {
                    Some(entry) => Ok(entry.response()),
                    None => {
                        unmatched.lock().expect("unmatched").push(call.clone());
                        Err(format!(
                            "no canned response for {} {} (dedup-host test)",
                            call.method, call.url
                        ))
                    }
                },
            );
        match route {
            Some(grant) => grant.answered_by(responder),
            None => HttpGrant::answered_only(responder),
        }
    }

    /// The case's failure when a call had no canned answer: the call, and the entry to add.
    pub fn failure(&self) -> Option<String> {
        let unmatched = self.unmatched.lock().expect("unmatched");
        let call = unmatched.first()?;
        Some(format!(
            "outbound call {} {} has no canned response (`dedup-host test` sends nothing); \
             add one to this case, or to every case, in the case file:\n\
             \x20   [[case.http]]          # or [[cases.http]] for every case\n\
             \x20   method = \"{}\"\n\
             \x20   url = \"{}\"\n\
             \x20   status = 200\n\
             \x20   body = \"...\"",
            call.method, call.url, call.method, call.url
        ))
    }
}
