//! Stranded messages: messages the server stopped delivering (their consumer's
//! `server_max_deliver` was reached) whose dead letter is not stored yet, because the
//! dead-letter stream was missing, full or unreachable, because the `MAX_DELIVERIES`
//! advisory reached no host, or because it reached only hosts that do not serve the
//! message's route (their config differs from its contract: they leave it to one that does).
//! Such a message is still in its stream (neither acked nor terminated) but nothing would
//! ever deliver it again.
//!
//! Each one gets a marker in the claim bucket, `=stranded.<stream>.<sequence>.<consumer>` (no
//! claim key starts with `=`: route names are letters, digits, `_` and `-`), written before a
//! host works on a message's last delivery (an exclusive route's partitions never give a
//! message up: their deliveries have no last one), kept unless that work ended the message, and written
//! when dead-lettering an undeliverable message fails. Every host sweeps the markers of its
//! deployment's consumers ([`owner`]) and retries each one with a bounded, jittered backoff
//! until its letter is stored (or its key turns out settled), then removes it; so neither a
//! missed advisory nor an outage at the last delivery loses a message. Meanwhile `audit` lists them
//! (`not_dead_lettered`), `/readyz` names them and `dedup_stranded_messages` counts them.

pub mod owner;

use std::time::Duration;

use async_nats::jetstream::kv::Store;
use async_nats::jetstream::Context;
use serde::{Deserialize, Serialize};

use crate::claim::record::now_ms;

/// The first token of every marker key.
pub const PREFIX: &str = "=stranded";

/// First retry of a marker's letter.
const RETRY_FIRST: Duration = Duration::from_secs(5);
/// Longest wait between two retries of a marker's letter.
const RETRY_MAX: Duration = Duration::from_secs(300);

/// One stranded message, as its marker records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    /// The stream holding it: the source stream, or an exclusive route's queue stream.
    pub stream: String,
    /// Its sequence there.
    pub sequence: u64,
    /// The durable consumer that gave it up (`None` on a marker written before markers named
    /// it). Part of the marker's key: two deployments whose routes both take a message each
    /// keep their own marker of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer: Option<String>,
    /// How many times the server delivered it.
    pub deliveries: u64,
    /// Why it was stranded.
    pub reason: String,
    /// Why its letter could not be stored, the last time it was tried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When it was first marked (ms since the epoch).
    pub since_ms: u64,
    /// How many times its letter was tried since.
    #[serde(default)]
    pub tries: u32,
    /// Not retried before this time (ms since the epoch).
    #[serde(default)]
    pub next_ms: u64,
}

/// Where a stranded message is and who gave it up.
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    /// The stream holding it.
    pub stream: &'a str,
    /// Its sequence there.
    pub sequence: u64,
    /// The durable consumer that gave it up.
    pub consumer: &'a str,
}

impl Marker {
    /// A new marker for the message at `origin`, due at once.
    pub fn new(origin: Origin<'_>, deliveries: u64, reason: String) -> Self {
        let now = now_ms();
        Self {
            stream: origin.stream.to_string(),
            sequence: origin.sequence,
            consumer: Some(origin.consumer.to_string()),
            deliveries,
            reason,
            error: None,
            since_ms: now,
            tries: 0,
            next_ms: now,
        }
    }

    /// Its key in the claim bucket: `=stranded.<stream>.<sequence>.<consumer>` (without the
    /// consumer on a marker that names none).
    pub fn key(&self) -> String {
        use dedup_delivery::revert::{reverted, Fix};
        match &self.consumer {
            _ if reverted(Fix::MarkersPerDeployment) => key(&self.stream, self.sequence),
            Some(consumer) => format!("{}.{consumer}", key(&self.stream, self.sequence)),
            None => key(&self.stream, self.sequence),
        }
    }

    /// The same marker after one more failed try, with `error` and its next try time.
    pub fn failed(mut self, error: String) -> Self {
        self.tries = self.tries.saturating_add(1);
        self.error = Some(error);
        self.next_ms = now_ms() + retry_after(self.tries).as_millis() as u64;
        self
    }

    /// The same marker, not tried before `wait` from now.
    pub fn not_before(mut self, wait: Duration) -> Self {
        self.next_ms = now_ms() + wait.as_millis() as u64;
        self
    }

    /// Whether its next try is due.
    pub fn due(&self) -> bool {
        self.next_ms <= now_ms()
    }
}

/// The key of the marker of `sequence` in `stream` that names no consumer (the prefix of
/// those that do).
pub fn key(stream: &str, sequence: u64) -> String {
    format!("{PREFIX}.{stream}.{sequence}")
}

/// The wait before try `tries + 1`: doubling from 5 s up to 5 minutes, with jitter (between
/// half and all of it) so that hosts sweeping the same markers do not retry in step.
pub fn retry_after(tries: u32) -> Duration {
    retry_ceiling(tries).mul_f64(rand::random_range(0.5..=1.0))
}

/// The wait [`retry_after`] jitters below (the simulation draws its own jitter).
pub fn retry_ceiling(tries: u32) -> Duration {
    let doublings = tries.saturating_sub(1).min(16);
    RETRY_FIRST.saturating_mul(1 << doublings).min(RETRY_MAX)
}

/// Whether the `delivered`-th delivery is the server's last (`server_max_deliver`): the host
/// marks the message before running it, so that it is found even if the host dies and the
/// advisory that follows reaches no host.
pub fn last_delivery(delivered: u64, server_max_deliver: i64) -> bool {
    delivered >= server_max_deliver.max(1) as u64
}

/// Writes `marker` (creating it, or replacing an older one). A write that fails is logged:
/// the advisory, when it arrives, is then the message's way out.
pub async fn mark(claims: &Store, marker: &Marker) {
    let value = serde_json::to_vec(marker).expect("a marker serializes");
    if let Err(e) = claims.put(marker.key(), value.into()).await {
        tracing::error!(
            stream = marker.stream,
            sequence = marker.sequence,
            "cannot record a stranded message in the claim bucket: {e}"
        );
    }
}

/// The marker of the message at `origin`, if there is one (and it can be read).
pub async fn load(claims: &Store, origin: Origin<'_>) -> Option<Marker> {
    let wanted = Marker::new(origin, 0, String::new()).key();
    let value = claims.get(wanted).await.ok()??;
    serde_json::from_slice(&value).ok()
}

/// Tries of a marker's removal once its message is out.
const FORGET_TRIES: u32 = 3;
/// The wait before the second try of a removal (doubled before the third).
const FORGET_RETRY: Duration = Duration::from_millis(100);

/// What [`forget`] needs of the claim bucket: a marker's removal.
pub trait MarkerStore: Sync {
    /// Removes `key` with its history.
    fn purge(&self, key: &str) -> impl std::future::Future<Output = Result<(), String>> + Send;
}

impl MarkerStore for Store {
    async fn purge(&self, key: &str) -> Result<(), String> {
        Store::purge(self, key).await.map_err(|e| e.to_string())
    }
}

/// Removes the marker under `key`: its message is out. Always a purge, never decided by a
/// read first: a read may come from a lagging replica that has not seen the marker the
/// caller just wrote (rule 1), and a marker left behind makes the sweep dead-letter a
/// message that was handled. A removal that fails is tried again a few times, then logged:
/// the next sweep finds the message gone or settled and removes the marker then.
pub async fn forget(claims: &impl MarkerStore, key: &str) {
    let mut wait = FORGET_RETRY;
    for tries in 1..=FORGET_TRIES {
        match claims.purge(key).await {
            Ok(()) => return,
            Err(e) if tries == FORGET_TRIES => {
                tracing::warn!("cannot remove stranded-message marker `{key}` ({tries} tries): {e}")
            }
            Err(_) => {
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
        }
    }
}

/// Every marker in claim bucket `bucket`, with its revision.
pub async fn list(js: &Context, bucket: &str) -> anyhow::Result<Vec<(Marker, u64)>> {
    let filter = format!("{PREFIX}.>");
    let entries = crate::scan::kv_latest(js, bucket, &filter).await?;
    Ok(entries
        .into_iter()
        .filter_map(|(_, m)| Some((serde_json::from_slice(&m.payload).ok()?, m.sequence)))
        .collect())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    use super::*;

    /// Markers in memory, whose first `failing_purges` purges fail.
    struct Flaky {
        keys: Mutex<BTreeSet<String>>,
        failing_purges: Mutex<u32>,
    }

    impl Flaky {
        fn holding(key: &str, failing_purges: u32) -> Self {
            Self {
                keys: Mutex::new([key.to_string()].into()),
                failing_purges: Mutex::new(failing_purges),
            }
        }

        fn has(&self, key: &str) -> bool {
            self.keys.lock().unwrap().contains(key)
        }
    }

    impl MarkerStore for Flaky {
        async fn purge(&self, key: &str) -> Result<(), String> {
            let mut failing = self.failing_purges.lock().unwrap();
            if *failing > 0 {
                *failing -= 1;
                return Err("timed out".into());
            }
            self.keys.lock().unwrap().remove(key);
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_marker_is_removed_though_a_purge_fails_once() {
        let key = "=stranded.SHOP.42";
        let flaky = Flaky::holding(key, 1);
        forget(&flaky, key).await;
        assert!(!flaky.has(key), "one failed purge left the marker behind");
        let other = Flaky::holding("=stranded.SHOP.7", 0);
        forget(&other, key).await;
        assert!(other.has("=stranded.SHOP.7"), "removed another marker");
    }

    /// A bucket whose reads would come from a replica that has not seen the marker yet:
    /// only a purge reaches the leader.
    struct Lagging(Mutex<BTreeSet<String>>);

    impl MarkerStore for Lagging {
        async fn purge(&self, key: &str) -> Result<(), String> {
            self.0.lock().unwrap().remove(key);
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_marker_a_lagging_read_does_not_show_is_removed() {
        let key = "=stranded.SHOP.42";
        let lagging = Lagging(Mutex::new([key.to_string()].into()));
        forget(&lagging, key).await;
        assert!(!lagging.0.lock().unwrap().contains(key));
    }

    #[test]
    fn retries_back_off_to_five_minutes_with_jitter() {
        assert!(retry_after(1) <= RETRY_FIRST && retry_after(1) >= RETRY_FIRST / 2);
        assert!(retry_after(3) >= RETRY_FIRST * 2);
        for tries in [10, 20, u32::MAX] {
            let d = retry_after(tries);
            assert!(d <= RETRY_MAX && d >= RETRY_MAX / 2, "{tries}: {d:?}");
        }
    }

    /// Message 42 of `SHOP`, given up by consumer `hosts-orders`.
    const SHOP_42: Origin<'static> = Origin {
        stream: "SHOP",
        sequence: 42,
        consumer: "hosts-orders",
    };

    #[test]
    fn a_marker_is_keyed_outside_every_claim_key_and_round_trips() {
        let m = Marker::new(SHOP_42, 100, "last delivery".into());
        assert_eq!(m.key(), "=stranded.SHOP.42.hosts-orders");
        assert!(m.due());
        let later = m.clone().failed("no stream".into());
        assert_eq!(later.tries, 1);
        assert!(!later.due());
        let back: Marker = serde_json::from_slice(&serde_json::to_vec(&later).unwrap()).unwrap();
        assert_eq!(back, later);
    }

    #[test]
    fn a_marker_written_before_markers_named_their_consumer_keeps_its_key() {
        let legacy: Marker = serde_json::from_str(
            r#"{"stream":"SHOP","sequence":7,"deliveries":3,"reason":"r","since_ms":1}"#,
        )
        .unwrap();
        assert_eq!(legacy.key(), "=stranded.SHOP.7");
    }
}
