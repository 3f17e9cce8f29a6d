//! Subjects the server refused this process for lack of permission.
//!
//! A refused publish or subscription is not an error of the call that made it: the server
//! drops it and says so on the connection (`-ERR 'Permissions Violation for Publish to
//! "…"'`), and a request waits for its answer until it times out. The connection's event
//! callback ([`crate::connect`]) records each refusal here and logs it at once; set-up stops
//! retrying when one was seen, and a failed start names the refused subject and the fix
//! instead of a timeout.
//!
//! The process-wide list serves a process that does one thing at a time (a CLI command, a
//! host's start). Where several actions run at once (the console's writes), each action
//! connects with its own [`Refusals`], so a refusal is reported by the action whose request
//! it was, never by another that failed meanwhile.

use std::sync::{Arc, Mutex};
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

/// Refusals with the time each was seen, the newest [`KEEP`].
type Seen = Mutex<Vec<(Instant, PermissionDenied)>>;

static SEEN: Seen = Mutex::new(Vec::new());

fn push(seen: &Seen, denied: PermissionDenied) {
    let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    if seen.len() == KEEP {
        seen.remove(0);
    }
    seen.push((Instant::now(), denied));
}

fn first_since(seen: &Seen, start: Instant) -> Option<PermissionDenied> {
    let seen = seen.lock().unwrap_or_else(|p| p.into_inner());
    seen.iter()
        .find(|(at, _)| *at >= start)
        .map(|(_, d)| d.clone())
}

/// Records and logs a server error when it is a refusal; returns whether it was one.
pub fn observe(server_error: &str) -> bool {
    Refusals::process().observe(server_error)
}

/// The first refusal any connection of this process saw since `start`, if any.
pub fn since(start: Instant) -> Option<PermissionDenied> {
    Refusals::process().since(start)
}

/// The refusals one action reads: those of every connection of the process, or those of
/// the action's own connection ([`Refusals::own`], given to
/// [`crate::connect::connect_observed`]).
#[derive(Debug, Clone, Default)]
pub struct Refusals {
    own: Option<Arc<Seen>>,
}

impl Refusals {
    /// Every connection's refusals: for a process that does one thing at a time.
    pub fn process() -> Self {
        Self { own: None }
    }

    /// An empty list for one connection: what the server refused that connection only.
    pub fn own() -> Self {
        Self {
            own: Some(Arc::default()),
        }
    }

    /// Records and logs a server error of the connection when it is a refusal (in the
    /// process-wide list too); returns whether it was one.
    pub fn observe(&self, server_error: &str) -> bool {
        let Some(denied) = PermissionDenied::parse(server_error) else {
            return false;
        };
        tracing::error!("{denied}");
        if let Some(own) = &self.own {
            push(own, denied.clone());
        }
        push(&SEEN, denied);
        true
    }

    /// The first refusal seen since `start`, if any.
    pub fn since(&self, start: Instant) -> Option<PermissionDenied> {
        first_since(self.own.as_deref().unwrap_or(&SEEN), start)
    }

    /// The refusal seen since `start` when there is one, else `error`'s text (see
    /// [`or_refused`]).
    pub fn or_refused(&self, error: impl std::fmt::Display, start: Instant) -> String {
        match self.since(start) {
            Some(denied) => format!("{denied} ({error})"),
            None => error.to_string(),
        }
    }

    /// `error`, named for the refusal behind it when one was seen since `start` (see
    /// [`explain`]).
    pub fn explain(&self, error: anyhow::Error, start: Instant) -> anyhow::Error {
        match self.since(start) {
            Some(denied) if error.downcast_ref::<PermissionDenied>().is_none() => {
                error.context(denied)
            }
            _ => error,
        }
    }
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
    Refusals::process().or_refused(error, start)
}

/// `error`, named for the refusal behind it when one was seen since `start` (a request that
/// timed out because its subject was refused, say).
pub fn explain(error: anyhow::Error, start: Instant) -> anyhow::Error {
    Refusals::process().explain(error, start)
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

    /// Two actions at once, each on its own connection: the refusal of one is not blamed
    /// for the other's failure (the console's writes).
    #[test]
    fn a_refusal_is_reported_by_its_own_connections_action_only() {
        let start = Instant::now();
        let (refused, other) = (Refusals::own(), Refusals::own());
        assert!(refused.observe("Permissions Violation for Publish to \"in.fixme.k1\""));
        let denied = refused.since(start).expect("its own refusal");
        assert_eq!(denied.subject, "in.fixme.k1");
        assert_eq!(other.since(start), None);
        let failed = other.explain(anyhow::anyhow!("the candidate changed meanwhile"), start);
        assert_eq!(format!("{failed:#}"), "the candidate changed meanwhile");
        assert_eq!(other.or_refused("timed out", start), "timed out");
        // The process-wide list still holds it (a CLI command's failure names it).
        assert!(since(start).is_some_and(|d| d.subject == "in.fixme.k1"));
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
