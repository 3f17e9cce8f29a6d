//! Whether any host serves a route, from a fact that lasts exactly as long as the serving:
//! while a host serves route R, its connection holds a subscription on
//! `dedup.control.serving.<deployment>.<source stream>.R` (taken before its first pull,
//! dropped after its drain; see [`serving_subject`]). A request there finds:
//!
//! - no subscriber: the server answers "no responders" at once, so no connected host serves R;
//! - an answer: the host named in it serves R;
//! - silence: a host holds the subscription but did not answer (paused, say by SIGSTOP, or
//!   too busy): it still serves R, since its connection is alive. Any other client
//!   subscribed there (a `nats sub '>'`) is silent too and cannot be told apart: hosts need
//!   to publish and subscribe on `dedup.control.>`, and nothing else may subscribe there.
//!
//! Status records ([`crate::components::status`]) expire while a host is paused; this does not
//! (the server drops the subscription only with the connection, when the host died or the
//! server's ping timeout cut it off).
//!
//! Hosts of the previous release hold `dedup.control.serving.<source stream>.R`
//! ([`previous_serving_subject`]), so a probe asks there too, and counts an answer or silence
//! there as serving: during a rolling upgrade, old hosts still serve. Hosts do not hold the
//! old subject themselves: it names no deployment, and another deployment's hosts holding it
//! would block this one's changes for good, the reason the subject changed.

use std::time::Duration;

use async_nats::{Client, RequestErrorKind};
use futures::StreamExt as _;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::subject::CONTROL_PREFIX;

/// How long a probe waits for a serving host's answer before taking its silence as "paused".
const ANSWER_WITHIN: Duration = Duration::from_secs(2);

/// The subject a host of `config` serving route `route` holds:
/// `dedup.control.serving.<deployment>.<source stream>.<route>`, so a subscriber of another
/// deployment's serving subject never answers (or stays silent) for this one. Every default
/// (`auto-`) name is one deployment here: a host and a change whose configs differ only in
/// their source subjects must still meet.
pub fn serving_subject(config: &Config, route: &str) -> String {
    let name = config.deployment_name();
    // Default names (`auto-<hash of the source subjects>`) change with the subjects: all of
    // them probe alike, so a host whose config predates a subject change is still found.
    let deployment: String = if name.starts_with("auto-") {
        "auto".into()
    } else {
        // A token of `[-_a-zA-Z0-9]`: two names that meet in it only make probes stricter.
        name.chars()
            .map(|c| match c {
                'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' => c,
                _ => '_',
            })
            .collect()
    };
    let stream = &config.source.stream;
    format!("{CONTROL_PREFIX}serving.{deployment}.{stream}.{route}")
}

/// The serving subject hosts of the previous release hold for route `route`:
/// `dedup.control.serving.<source stream>.<route>`, without the deployment. Only probed.
pub fn previous_serving_subject(config: &Config, route: &str) -> String {
    format!("{CONTROL_PREFIX}serving.{}.{route}", config.source.stream)
}

/// A held serving subscription: dropped (after the route drained), it is given up.
#[derive(Debug)]
pub struct Held(JoinHandle<()>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Holds route `route`'s serving subscription for host `instance_id` of `config`, answering
/// probes with the instance id, until the returned [`Held`] is dropped.
pub async fn hold(
    client: &Client,
    config: &Config,
    route: &str,
    instance_id: &str,
) -> Result<Held, async_nats::SubscribeError> {
    let mut subscription = client.subscribe(serving_subject(config, route)).await?;
    let client = client.clone();
    let answer = bytes::Bytes::from(instance_id.to_string());
    Ok(Held(tokio::spawn(async move {
        while let Some(probe) = subscription.next().await {
            match probe.reply {
                Some(reply) if crate::subject::is_request_inbox(&reply) => {
                    let _ = client.publish(reply, answer.clone()).await;
                }
                Some(reply) => {
                    tracing::warn!("a serving probe asked for its answer on `{reply}`, not a request inbox: not answered")
                }
                None => {}
            }
        }
    })))
}

/// What a probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// No host holds the subscription.
    NoneServes,
    /// Host (instance id) answered: it serves the route.
    Answered(String),
    /// A subscriber holds the subscription but did not answer: a host paused or busy, or
    /// another client subscribed to the subject. Names each serving subject that was silent
    /// (the route's, the previous release's, or both), so the operator looks where it was.
    Silent(Vec<String>),
}

impl Probe {
    /// What two probes found together: an answer over silence over nobody; silences keep
    /// every subject that was silent.
    fn or(self, other: Probe) -> Probe {
        match (self, other) {
            (a @ Probe::Answered(_), _) | (_, a @ Probe::Answered(_)) => a,
            (Probe::Silent(mut a), Probe::Silent(b)) => {
                a.extend(b);
                Probe::Silent(a)
            }
            (s @ Probe::Silent(_), _) | (_, s @ Probe::Silent(_)) => s,
            (Probe::NoneServes, Probe::NoneServes) => Probe::NoneServes,
        }
    }
}

/// Asks who serves route `route` of `config`'s deployment: on its serving subject, and on the
/// one hosts of the previous release hold ([`previous_serving_subject`]), at once.
pub async fn probe(client: &Client, config: &Config, route: &str) -> Result<Probe, ProbeError> {
    let (now, before) = tokio::join!(
        ask(client, serving_subject(config, route)),
        ask(client, previous_serving_subject(config, route)),
    );
    Ok(now?.or(before?))
}

/// Asks who holds serving subject `subject`.
async fn ask(client: &Client, subject: String) -> Result<Probe, ProbeError> {
    let request = client.request(subject.clone(), bytes::Bytes::new());
    match tokio::time::timeout(ANSWER_WITHIN, request).await {
        Err(_) => Ok(Probe::Silent(vec![subject])),
        Ok(Ok(answer)) => Ok(Probe::Answered(
            String::from_utf8_lossy(&answer.payload).into_owned(),
        )),
        Ok(Err(e)) => match e.kind() {
            RequestErrorKind::NoResponders => Ok(Probe::NoneServes),
            RequestErrorKind::TimedOut => Ok(Probe::Silent(vec![subject])),
            _ => Err(ProbeError {
                subject,
                reason: e.to_string(),
            }),
        },
    }
}

/// A probe could not be sent.
#[derive(Debug, thiserror::Error)]
#[error("cannot ask who serves the route on `{subject}`: {reason}; check the connection and that this user may publish there and subscribe to `_INBOX.>`")]
pub struct ProbeError {
    /// The serving subject.
    pub subject: String,
    /// What the client said.
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::Probe;

    #[test]
    fn a_silence_keeps_the_subject_that_was_silent() {
        let silent = |s: &str| Probe::Silent(vec![s.to_string()]);
        assert_eq!(Probe::NoneServes.or(silent("old")), silent("old"));
        assert_eq!(silent("new").or(Probe::NoneServes), silent("new"));
        assert_eq!(
            silent("new").or(silent("old")),
            Probe::Silent(vec!["new".into(), "old".into()])
        );
        let answered = Probe::Answered("h".into());
        assert_eq!(silent("new").or(answered.clone()), answered);
    }
}
