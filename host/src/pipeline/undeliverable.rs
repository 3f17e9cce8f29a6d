//! Messages the server gave up delivering: their consumer reached `source.server_max_deliver`
//! (an outage that outlasted every retry, or a message the client cannot parse at all, such as
//! a subject that is not UTF-8: async-nats drops the connection each time it is delivered, so
//! the pipeline never sees it; an unparsable header block is delivered, see `unreadable`).
//! The server then publishes a `MAX_DELIVERIES` advisory, for the source stream and for an
//! exclusive route's queue stream alike; this loop reads the message through the JetStream API
//! (where headers arrive base64-encoded), cleans its headers, and dead-letters it, unless its
//! key was settled meanwhile (then it was only a duplicate) or is still running under a live
//! lease (a decision the simulation runs too: [`dedup_delivery::undeliverable`]). The key is then recorded as
//! failed for good; a claim-after key on a route with outputs as one whose window outputs may
//! be stored, by a version not known: whether a delivery published part of them cannot be
//! told here, so the mark is conservative, and names no version a replay would be pinned to.
//!
//! A letter that cannot be stored now (the dead-letter stream is missing, full or
//! unreachable), or an advisory no host heard, must not lose the message: it stays in its
//! stream, a marker records it ([`crate::stranded`]), and every host sweeps the markers and
//! retries them with a bounded backoff until the letter is stored.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::{HeaderMap, HeaderName, HeaderValue, Message, Subject};
use dedup_delivery::revert::{reverted, Fix};
use dedup_delivery::undeliverable::{self as given_up, GivenUp};
use futures::StreamExt;
use serde::Deserialize;
use tokio::sync::watch;

use super::effects::{self, DeadLetter};
use super::Shared;
use crate::claim::record::now_ms;
use crate::claim::ClaimStore;
use crate::metrics::MessageOutcome;
use crate::stranded::owner::Consumers;
use crate::stranded::{self, Marker, Origin};

/// The queue group a deployment's hosts share, so one of them handles each advisory; the
/// deployment's name follows (each deployment hears every advisory, and takes its own).
const QUEUE: &str = "dedup-host-undeliverable";

/// How often a host reads the markers (jittered, so hosts do not sweep in step).
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// The fields of a `MAX_DELIVERIES` advisory the host uses.
#[derive(Debug, Deserialize)]
struct Advisory {
    stream: String,
    consumer: String,
    stream_seq: u64,
    deliveries: u64,
}

/// A given-up message of a route this host does not serve (its config differs from the
/// route's contract on the server): a host that serves the route letters it.
#[derive(Debug, thiserror::Error)]
#[error("route `{0}` is not served here under its contract (this host's config differs from it, or was not checked against it yet): a host that serves it dead-letters this message")]
struct NotServedHere(String);

/// Handles advisories until `stopped`.
pub(super) async fn run<S: ClaimStore>(
    shared: Arc<Shared<S>>,
    client: async_nats::Client,
    mut stopped: watch::Receiver<bool>,
) {
    let streams = [
        shared.config.source.stream.clone(),
        crate::exclusive::stream_name(&shared.config),
    ];
    let deployment = shared.config.deployment_name();
    let queue = format!(
        "{QUEUE}.{}",
        dedup_delivery::subject::name_token(&deployment)
    );
    let mut subscriptions = Vec::new();
    for stream in &streams {
        let subject = format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.*");
        match client.queue_subscribe(subject, queue.clone()).await {
            Ok(s) => subscriptions.push(s),
            Err(e) => tracing::error!("cannot follow max-deliveries advisories of `{stream}`; its undeliverable messages wait for the sweep: {e}"),
        }
    }
    let mut advisories = futures::stream::select_all(subscriptions);
    loop {
        let advisory = tokio::select! {
            a = advisories.next() => match a { Some(a) => a, None => return },
            _ = stopped.changed() => return,
        };
        let Ok(a) = serde_json::from_slice::<Advisory>(&advisory.payload) else {
            continue;
        };
        if !streams.contains(&a.stream) {
            continue;
        }
        let origin = Origin {
            stream: &a.stream,
            sequence: a.stream_seq,
            consumer: &a.consumer,
        };
        let take = (shared.consumers())
            .take(&shared.js, &a.stream, Some(&a.consumer))
            .await;
        let marker = match take {
            // Another deployment's consumer on a shared stream: its own hosts hear it too.
            Ok(false) => continue,
            Ok(true) => stranded::load(&shared.markers, origin).await,
            Err(e) => {
                // Whose it is is decided by the sweep, once the server answers (a marker
                // already there, its owner's, is kept as it is).
                if stranded::load(&shared.markers, origin).await.is_none() {
                    let reason = format!("delivered {} times; {e}", a.deliveries);
                    let marker = Marker::new(origin, a.deliveries, reason);
                    stranded::mark(&shared.markers, &marker).await;
                }
                continue;
            }
        };
        let standing = marker.is_some();
        let marker = marker.unwrap_or_else(|| {
            let reason = format!("delivered {} times", a.deliveries);
            Marker::new(origin, a.deliveries, reason)
        });
        shared.rescue(&client, marker, standing).await;
    }
}

/// Retries the stranded messages' letters as they fall due, until `stopped`; after each pass
/// sets the `dedup_stranded_messages` gauge to the markers it left: those it tried and could
/// not letter (the letter failed, or no host here serves the route) and those not due yet.
pub(super) async fn sweep<S: ClaimStore>(
    shared: Arc<Shared<S>>,
    client: async_nats::Client,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        let wait = SWEEP_EVERY.mul_f64(rand::random_range(0.5..=1.5));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stopped.changed() => return,
        }
        let markers = match stranded::list(&shared.js, &shared.config.claims.bucket).await {
            Ok(markers) => markers,
            Err(e) => {
                tracing::warn!("cannot read the stranded-message markers: {e:#}");
                continue;
            }
        };
        // Another deployment's markers are its hosts' to sweep, under their routes (and one
        // whose consumer cannot be judged now waits for the next sweep).
        let markers = shared.consumers().keep(&shared.js, markers, false).await;
        let metrics = shared.routes.metrics();
        let mut left = markers.len() as u64;
        for (marker, _) in markers.into_iter().filter(|(m, _)| m.due()) {
            if *stopped.borrow() {
                return;
            }
            if shared.rescue(&client, marker, true).await {
                left -= 1;
            }
        }
        metrics.set_stranded(left);
    }
}

impl<S: ClaimStore> Shared<S> {
    /// The consumers whose given-up messages this host takes: its routes' as they are now.
    fn consumers(&self) -> Consumers {
        let routes: Vec<_> = self.routes.iter().collect();
        let named =
            (routes.iter()).map(|r| (r.name.as_str(), r.exclusive.as_ref().map(|e| e.partitions)));
        Consumers::named(&self.config, named)
    }

    /// Dead-letters the message `marker` names and removes the marker; if the letter cannot
    /// be stored, records why and when to try again; if this host does not serve its route,
    /// leaves the marker for one that does (writing it unless it is `standing`: the advisory
    /// found none). Returns whether the message is out.
    async fn rescue(&self, client: &async_nats::Client, marker: Marker, standing: bool) -> bool {
        let key = marker.key();
        match self.undeliverable(client, &marker).await {
            Ok(()) => {
                stranded::forget(&self.markers, &key).await;
                true
            }
            Err(e) if e.is::<NotServedHere>() => {
                // A standing marker is left as it is (rewritten, it could come back after a
                // host that serves the route removed it).
                let (stream, sequence) = (&marker.stream, marker.sequence);
                tracing::info!(stream, sequence, "{e}");
                if !standing {
                    stranded::mark(&self.markers, &marker).await;
                }
                false
            }
            Err(e) => {
                let (stream, sequence) = (&marker.stream, marker.sequence);
                tracing::error!(stream, sequence, "undeliverable message not dead-lettered yet; it stays in its stream and is retried: {e:#}");
                stranded::mark(&self.markers, &marker.failed(format!("{e:#}"))).await;
                false
            }
        }
    }

    /// Dead-letters the message `marker` names, unless it is gone or its key was settled.
    async fn undeliverable(
        &self,
        client: &async_nats::Client,
        marker: &Marker,
    ) -> anyhow::Result<()> {
        let Some(mut message) = fetch(client, &marker.stream, marker.sequence).await? else {
            return Ok(()); // deleted or purged meanwhile: nothing is left to strand
        };
        let queued = marker.stream != self.config.source.stream;
        let sequence = if queued {
            // A queued copy: its letter is the original's.
            let (subject, source_sequence, headers) =
                crate::exclusive::original(message.headers.as_ref())
                    .context("a queued message without its origin headers")?;
            message.subject = subject.into();
            message.headers = Some(headers);
            source_sequence
        } else {
            marker.sequence
        };
        let route = self.routes.find(&message.subject);
        // Its key, claim mode and effects are the route's contract; a host whose config
        // differs from it (a change not applied yet, or hosts of mixed configs) would letter
        // it under its own, so only a host that serves the route does.
        let not_served = route.as_ref().filter(|r| !r.agrees_with_contract());
        if let Some(not_served) = not_served.filter(|_| !reverted(Fix::LetterWhereServed)) {
            return Err(NotServedHere(not_served.name.clone()).into());
        }
        let mut attempt = 0;
        let mut last_reason = None;
        let mut claim = None;
        // Keyed as the pipeline keys it: a proven replay under its first message id.
        let key = match &route {
            Some(r) => super::replayed::key_of(
                &self.js,
                &self.config.dead_letter.stream,
                &r.key,
                &message.subject,
                message.headers.as_ref(),
                &message.payload,
            )
            .await?
            .ok(),
            None => None,
        };
        if let (Some(route), Some(key)) = (&route, &key) {
            let claim_key = route.claim_key(key);
            if let Some((record, revision)) = self.claimer.store().get(&claim_key).await? {
                let skew = self.config.claims.clock_skew;
                // Judged by its source message: a key coalesced under it or a later message
                // of its key settles it.
                match given_up::decide(Some(&record), Some(sequence), now_ms(), skew) {
                    GivenUp::Settled => return self.drop_queued(client, marker, queued).await,
                    GivenUp::Running { owner } => {
                        anyhow::bail!("key `{key}` is still in progress by `{owner}`; its dead letter waits until that ends");
                    }
                    GivenUp::Letter {
                        attempt: a,
                        last_reason: last,
                    } => (attempt, last_reason) = (a, last),
                }
                claim = Some((claim_key, record, revision));
            }
        }
        let reason = given_up::reason(marker.deliveries, last_reason.as_deref());
        let letter = DeadLetter {
            reason: &reason,
            attempt,
            route: route.as_ref().map_or("", |r| r.name.as_str()),
            key: key.as_deref().unwrap_or_default(),
            id: format!("dl:seq:{sequence}"),
            digest: "",
        };
        tracing::error!(sequence, subject = %message.subject, "dead-lettering: {reason}");
        let subject = &self.config.dead_letter.subject;
        effects::publish_dead_letter(&self.js, subject, &message, sequence, letter).await?;
        // A claim-after key may have no record yet a delivery may have stored part of its
        // outputs before the server gave up: its record says so (see `dead_after`). Which
        // version ran is not known (the live one may be newer): none is named.
        let after = route.as_ref().filter(|r| r.claim_after);
        if let Some((claim_key, mut record, revision)) = claim {
            // `inspect` and `audit` then see the key failed for good, as a dead letter says.
            given_up::failed_for_good(&mut record, reason.clone(), now_ms());
            if let Some(route) = after {
                let dead = self.dead_after(route, &record.digest, attempt, reason.clone(), true);
                record.unknown_effects |= dead.unknown_effects;
            }
            if let Err(e) = self
                .claimer
                .store()
                .update(&claim_key, &record, revision)
                .await
            {
                tracing::warn!(
                    "dead letter stored, but its claim record was not marked failed: {e}"
                );
            }
        } else if let (Some(route), Some(key)) = (after, &key) {
            let record = self.dead_after(route, "", attempt, reason.clone(), true);
            let written = (self.claimer)
                .create_settled(&route.claim_key(key), &record)
                .await;
            if let Err(e) = written {
                tracing::warn!("dead letter stored, but its claim record was not written: {e}");
            }
        }
        self.metrics_of(route.as_ref())
            .outcome(MessageOutcome::DeadLettered);
        self.drop_queued(client, marker, queued).await
    }

    /// Deletes a queued copy that is settled or dead-lettered: the queue keeps only work.
    async fn drop_queued(
        &self,
        client: &async_nats::Client,
        marker: &Marker,
        queued: bool,
    ) -> anyhow::Result<()> {
        if queued {
            let api = format!("$JS.API.STREAM.MSG.DELETE.{}", marker.stream);
            let body = serde_json::json!({ "seq": marker.sequence, "no_erase": true });
            client.request(api, body.to_string().into()).await?;
        }
        Ok(())
    }
}

/// Message `sequence` of `stream`, with its headers cleaned; `None` when it is gone.
async fn fetch(
    client: &async_nats::Client,
    stream: &str,
    sequence: u64,
) -> anyhow::Result<Option<Message>> {
    Ok(super::stored::by_sequence(client, stream, sequence)
        .await?
        .map(decode))
}

/// The stored message with its headers cleaned: each line that parses as `name: value` is
/// kept (invalid UTF-8 replaced, control characters dropped), everything else is dropped.
fn decode(stored: super::stored::Stored) -> Message {
    let payload = stored.payload;
    let headers = stored.headers.map(|raw| {
        let text = String::from_utf8_lossy(&raw);
        let mut headers = HeaderMap::new();
        for line in text.lines().skip(1) {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value: String = value.trim().chars().filter(|c| !c.is_control()).collect();
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_str(name.trim()),
                HeaderValue::from_str(&value),
            ) {
                headers.append(name, value);
            }
        }
        headers
    });
    let length = payload.len();
    Message {
        subject: Subject::from(stored.subject),
        reply: None,
        payload: payload.into(),
        headers,
        status: None,
        description: None,
        length,
        raw_headers: None,
    }
}
