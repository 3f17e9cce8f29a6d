//! Subjects the server refused this process for lack of permission.
//!
//! A refused publish or subscription is not an error of the call that made it: the server
//! drops it and says so on the connection (`-ERR 'Permissions Violation for Publish to
//! "…"'`), and a request waits for its answer until it times out. The connection's event
//! callback ([`crate::connect`]) records each refusal here and logs it at once; set-up stops
//! retrying when one was seen, and a failed start names the refused subject and the fix
//! instead of a timeout.

use std::sync::Mutex;
use std::time::Instant;

use thiserror::Error;

/// The refusals kept (the newest); older ones are logged only.
const KEEP: usize = 16;

/// The server refused a publish or subscription of this process.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("NATS refused to let this client {operation} `{subject}` (permissions violation): grant `{subject}` to the user this client connects as; `dedup-host permissions --config <config> --role host|operator|console` prints every subject each role needs")]
pub struct PermissionDenied {
    /// `publish to` or `subscribe to`.
    pub operation: &'static str,
    /// The refused subject, as the server named it.
    pub subject: String,
}

impl PermissionDenied {
    /// The refusal in a server error's text, if it is one.
    pub fn parse(text: &str) -> Option<Self> {
        let (_, rest) = text.split_once("Permissions Violation for ")?;
        let operation = if rest.starts_with("Publish") {
            "publish to"
        } else if rest.starts_with("Subscription") {
            "subscribe to"
        } else {
            return None;
        };
        let (_, quoted) = rest.split_once('"')?;
        let (subject, _) = quoted.split_once('"')?;
        Some(Self {
            operation,
            subject: subject.to_string(),
        })
    }
}

static SEEN: Mutex<Vec<(Instant, PermissionDenied)>> = Mutex::new(Vec::new());

/// Records and logs a server error when it is a refusal; returns whether it was one.
pub fn observe(server_error: &str) -> bool {
    let Some(denied) = PermissionDenied::parse(server_error) else {
        return false;
    };
    tracing::error!("{denied}");
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    if seen.len() == KEEP {
        seen.remove(0);
    }
    seen.push((Instant::now(), denied));
    true
}

/// The first refusal seen since `start`, if any.
pub fn since(start: Instant) -> Option<PermissionDenied> {
    let seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    seen.iter()
        .find(|(at, _)| *at >= start)
        .map(|(_, d)| d.clone())
}

/// A route's output the server refused for lack of permission: no retry stores it until the
/// host's user may publish there, so the message is dead-lettered with this as its reason.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("NATS refused this host permission to publish output `{subject}` of route `{route}` (permissions violation): grant publish on `{filter}` (the route's `allowed_outputs`) to the user the hosts connect as (`dedup-host permissions --config <config> --role host` prints it), then replay this letter with `dedup-host dead-letters replay`")]
pub struct OutputRefused {
    /// The route.
    pub route: String,
    /// The refused output subject.
    pub subject: String,
    /// The route's `allowed_outputs` filter that covers it: what to grant.
    pub filter: String,
}

impl OutputRefused {
    /// The refusal of a publish to one of `subjects`, route `route`'s outputs (its
    /// `allowed_outputs` are `filters`), seen since `start`, if any.
    pub fn find<'a>(
        route: &str,
        filters: &[String],
        subjects: impl IntoIterator<Item = &'a str>,
        start: Instant,
    ) -> Option<Self> {
        let subjects: Vec<&str> = subjects.into_iter().collect();
        let seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
        let (_, denied) = seen.iter().find(|(at, d)| {
            *at >= start && d.operation == "publish to" && subjects.contains(&d.subject.as_str())
        })?;
        let filter = filters
            .iter()
            .find(|f| crate::subject::matches(f, &denied.subject))
            .unwrap_or(&denied.subject);
        Some(Self {
            route: route.to_string(),
            subject: denied.subject.clone(),
            filter: filter.clone(),
        })
    }
}

/// The refusal seen since `start` when there is one, else `error`'s text: the detail of one
/// item of a batch (a letter replayed, say) whose write failed or timed out because the
/// server dropped it, so the operator reads the subject to grant rather than a timeout.
pub fn or_refused(error: impl std::fmt::Display, start: Instant) -> String {
    match since(start) {
        Some(denied) => format!("{denied} ({error})"),
        None => error.to_string(),
    }
}

/// `error`, named for the refusal behind it when one was seen since `start` (a request that
/// timed out because its subject was refused, say).
pub fn explain(error: anyhow::Error, start: Instant) -> anyhow::Error {
    match since(start) {
        Some(denied) if error.downcast_ref::<PermissionDenied>().is_none() => error.context(denied),
        _ => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_violation_texts_are_parsed() {
        let p = PermissionDenied::parse(
            "Permissions Violation for Publish to \"$JS.API.STREAM.INFO.EVENTS\"",
        )
        .unwrap();
        assert_eq!(
            (p.operation, p.subject.as_str()),
            ("publish to", "$JS.API.STREAM.INFO.EVENTS")
        );
        let s = PermissionDenied::parse("Permissions Violation for Subscription to \"_INBOX.>\"")
            .unwrap();
        assert_eq!(s.operation, "subscribe to");
        assert!(PermissionDenied::parse("Authorization Violation").is_none());
    }

    #[test]
    fn a_refused_output_names_the_routes_filter_not_the_subject() {
        let start = Instant::now();
        assert!(observe(
            "Permissions Violation for Publish to \"out.r.k1.done\""
        ));
        let filters = ["other.>".to_string(), "out.r.*.done".to_string()];
        let refused = OutputRefused::find("r", &filters, ["out.r.k1.done"], start).unwrap();
        assert_eq!(refused.filter, "out.r.*.done");
        let text = refused.to_string();
        assert!(text.contains("`out.r.*.done`") && text.contains("dead-letters replay"));
        assert!(OutputRefused::find("r", &filters, ["out.r.k2.done"], start).is_none());
        assert!(OutputRefused::find("r", &filters, ["out.r.k1.done"], Instant::now()).is_none());
    }
}
