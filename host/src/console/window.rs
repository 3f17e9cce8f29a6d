//! The last 15 minutes of every host's feed ([`crate::feed`]), followed live from the feed
//! stream by one ordered consumer, and what the overview shows from it: the hosts, each
//! route's counts over the window (exact: a host started inside the window counts from zero)
//! and per-interval series for the charts.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_nats::jetstream::consumer::pull::OrderedConfig;
use async_nats::jetstream::consumer::DeliverPolicy;
use futures::StreamExt;
use serde::Serialize;

use crate::claim::record::now_ms;
use crate::config::Config;
use crate::feed::{self, HostStats};
use crate::metrics::latency::{self, BUCKETS};
use crate::metrics::RouteCounts;

/// How far back the overview looks.
pub const SPAN: Duration = Duration::from_secs(15 * 60);
/// One point of a chart.
pub const STEP: Duration = Duration::from_secs(15);
/// A host whose last snapshot is older than this is shown as gone.
const GONE_AFTER: Duration = Duration::from_secs(15);

/// Every host process's snapshots inside the window, oldest first, by (instance id, start):
/// a host restarted under the same instance id counts from zero again, so each of its
/// processes is summed on its own.
#[derive(Debug, Default)]
pub struct Window {
    hosts: Mutex<HashMap<(String, u64), VecDeque<HostStats>>>,
}

/// One host as the overview lists it.
#[derive(Debug, Clone, Serialize)]
pub struct HostView {
    /// Its instance id.
    pub instance_id: String,
    /// The version it runs.
    pub version: String,
    /// Seconds since it started.
    pub uptime_s: u64,
    /// Whether it is ready.
    pub ready: bool,
    /// Why not, one sentence each.
    pub missing: Vec<String>,
    /// Warnings that need an operator.
    pub warnings: Vec<String>,
    /// Seconds since its last snapshot.
    pub seen_s: u64,
    /// Whether it stopped publishing (stopped or cut off).
    pub gone: bool,
}

/// One route over the window, summed over hosts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RouteView {
    /// Deliveries by outcome in the window.
    pub outcomes: BTreeMap<String, u64>,
    /// Repeats caught by layer in the window.
    pub hits: BTreeMap<String, u64>,
    /// Outputs published in the window.
    pub outputs: u64,
    /// In flight now, over all hosts.
    pub in_flight: u64,
    /// Free guest slots now, over all hosts.
    pub free_slots: u64,
    /// The consumer's pending messages now (one consumer, shared by the hosts).
    pub pending: u64,
    /// The consumer's unacknowledged messages now.
    pub ack_pending: u64,
    /// Deliveries per [`STEP`] by outcome, oldest first, [`SPAN`]/[`STEP`] points.
    pub series: BTreeMap<String, Vec<u64>>,
    /// The consumer's pending messages per [`STEP`] (the most read in it), oldest first.
    pub pending_series: Vec<u64>,
    /// Guest time per [`STEP`], oldest first.
    pub guest_ms: Percentiles,
    /// Time the host added per [`STEP`] (handling minus guest time), oldest first.
    pub added_ms: Percentiles,
    /// Guest times over the window, counted per bucket of [`latency::BOUNDS_US`].
    pub guest_histogram: Vec<u64>,
    /// Times the host added over the window, per bucket of [`latency::BOUNDS_US`].
    pub added_histogram: Vec<u64>,
}

/// A latency's median and 99th percentile per [`STEP`], in milliseconds; `None` for a step
/// in which nothing was measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Percentiles {
    /// The median of each step.
    pub p50: Vec<Option<f64>>,
    /// The 99th percentile of each step.
    pub p99: Vec<Option<f64>>,
}

impl Percentiles {
    /// The percentiles of each step's distribution.
    fn of(steps: &[Vec<u64>]) -> Self {
        Self {
            p50: steps.iter().map(|b| latency::quantile(b, 0.5)).collect(),
            p99: steps.iter().map(|b| latency::quantile(b, 0.99)).collect(),
        }
    }
}

/// One route's latency distributions per step, while [`Window::routes`] sums them.
struct StepTimes {
    guest: Vec<Vec<u64>>,
    added: Vec<Vec<u64>>,
}

impl StepTimes {
    fn new(points: usize) -> Self {
        Self {
            guest: vec![vec![0; BUCKETS]; points],
            added: vec![vec![0; BUCKETS]; points],
        }
    }

    fn add(&mut self, slot: usize, now: &RouteCounts, before: &RouteCounts) {
        let pairs = [
            (&mut self.guest[slot], &now.guest_time, &before.guest_time),
            (&mut self.added[slot], &now.added_time, &before.added_time),
        ];
        for (sum, now, before) in pairs {
            for (s, d) in sum.iter_mut().zip(latency::difference(now, before)) {
                *s += d;
            }
        }
    }
}

impl Window {
    /// Adds one snapshot and forgets what fell out of the window.
    pub fn add(&self, stats: HostStats) {
        let mut hosts = self.hosts.lock().expect("window lock");
        let horizon = now_ms().saturating_sub(SPAN.as_millis() as u64);
        let process = (stats.instance_id.clone(), stats.started_ms);
        let snapshots = hosts.entry(process).or_default();
        snapshots.push_back(stats);
        while snapshots.front().is_some_and(|s| s.at_ms < horizon) && snapshots.len() > 1 {
            snapshots.pop_front();
        }
        hosts.retain(|_, s| s.back().is_some_and(|last| last.at_ms >= horizon));
    }

    /// The hosts seen in the window (each instance id's newest process), live ones first.
    pub fn hosts(&self) -> Vec<HostView> {
        let now = now_ms();
        let hosts = self.hosts.lock().expect("window lock");
        let mut newest: HashMap<&str, &HostStats> = HashMap::new();
        for last in hosts.values().filter_map(|s| s.back()) {
            let kept = newest.entry(&last.instance_id).or_insert(last);
            if last.started_ms > kept.started_ms {
                *kept = last;
            }
        }
        let mut out: Vec<HostView> = newest
            .into_values()
            .map(|last| {
                let seen = now.saturating_sub(last.at_ms);
                HostView {
                    instance_id: last.instance_id.clone(),
                    version: last.version.clone(),
                    uptime_s: now.saturating_sub(last.started_ms) / 1000,
                    ready: last.ready,
                    missing: last.missing.clone(),
                    warnings: last.warnings.clone(),
                    seen_s: seen / 1000,
                    gone: seen > GONE_AFTER.as_millis() as u64,
                }
            })
            .collect();
        out.sort_by(|a, b| (a.gone, &a.instance_id).cmp(&(b.gone, &b.instance_id)));
        out
    }

    /// Every route any host reported, over the window.
    pub fn routes(&self) -> BTreeMap<String, RouteView> {
        let now = now_ms();
        let start = now.saturating_sub(SPAN.as_millis() as u64);
        let points = (SPAN.as_secs() / STEP.as_secs()) as usize;
        let hosts = self.hosts.lock().expect("window lock");
        let mut out: BTreeMap<String, RouteView> = BTreeMap::new();
        let mut times: BTreeMap<String, StepTimes> = BTreeMap::new();
        for snapshots in hosts.values() {
            let Some(last) = snapshots.back() else {
                continue;
            };
            let live = now.saturating_sub(last.at_ms) <= GONE_AFTER.as_millis() as u64;
            // A host started inside the window counts from zero; others from their first
            // snapshot inside it.
            let zero = HostStats::default();
            let none = RouteCounts::default();
            let base = if last.started_ms >= start {
                &zero
            } else {
                snapshots.iter().find(|s| s.at_ms >= start).unwrap_or(last)
            };
            for (name, counts) in &last.routes {
                let view = out.entry(name.clone()).or_default();
                add_differences(view, counts, base.routes.get(name).unwrap_or(&none));
                if live {
                    view.in_flight += counts.in_flight;
                    view.free_slots += counts.free_slots;
                    view.pending = view.pending.max(counts.pending);
                    view.ack_pending = view.ack_pending.max(counts.ack_pending);
                }
            }
            let mut previous = base;
            for s in snapshots.iter().filter(|s| s.at_ms >= start) {
                let slot = ((s.at_ms - start) / STEP.as_millis() as u64) as usize;
                for (name, counts) in &s.routes {
                    let before = previous.routes.get(name).unwrap_or(&none);
                    let slot = slot.min(points - 1);
                    (times.entry(name.clone()))
                        .or_insert_with(|| StepTimes::new(points))
                        .add(slot, counts, before);
                    let view = out.entry(name.clone()).or_default();
                    view.pending_series.resize(points, 0);
                    view.pending_series[slot] = view.pending_series[slot].max(counts.pending);
                    for (outcome, n) in &counts.outcomes {
                        let d =
                            n.saturating_sub(before.outcomes.get(outcome).copied().unwrap_or(0));
                        let series = view
                            .series
                            .entry(outcome.clone())
                            .or_insert_with(|| vec![0; points]);
                        series[slot] += d;
                    }
                }
                previous = s;
            }
        }
        for (name, steps) in times {
            let view = out.entry(name).or_default();
            view.guest_ms = Percentiles::of(&steps.guest);
            view.added_ms = Percentiles::of(&steps.added);
        }
        out
    }
}

fn add_differences(view: &mut RouteView, now: &RouteCounts, before: &RouteCounts) {
    for (outcome, n) in &now.outcomes {
        let d = n.saturating_sub(before.outcomes.get(outcome).copied().unwrap_or(0));
        *view.outcomes.entry(outcome.clone()).or_default() += d;
    }
    for (layer, n) in &now.hits {
        let d = n.saturating_sub(before.hits.get(layer).copied().unwrap_or(0));
        *view.hits.entry(layer.clone()).or_default() += d;
    }
    view.outputs += now.outputs.saturating_sub(before.outputs);
    let histograms = [
        (
            &mut view.guest_histogram,
            &now.guest_time,
            &before.guest_time,
        ),
        (
            &mut view.added_histogram,
            &now.added_time,
            &before.added_time,
        ),
    ];
    for (sum, now, before) in histograms {
        sum.resize(BUCKETS, 0);
        for (s, d) in sum.iter_mut().zip(latency::difference(now, before)) {
            *s += d;
        }
    }
}

/// Follows the feed stream into `window` for as long as the console runs, from
/// [`SPAN`] ago; a broken consumer is made again from the last snapshot read.
pub async fn follow(js: async_nats::jetstream::Context, config: Arc<Config>, window: Arc<Window>) {
    let mut from = SystemTime::now() - SPAN;
    loop {
        if let Err(e) = follow_once(&js, &config, &window, &mut from).await {
            tracing::debug!("console feed: {e:#}");
        }
        tokio::time::sleep(feed::EVERY).await;
    }
}

async fn follow_once(
    js: &async_nats::jetstream::Context,
    config: &Config,
    window: &Window,
    from: &mut SystemTime,
) -> anyhow::Result<()> {
    let stream = feed::open(js, config).await?;
    let consumer = stream
        .create_consumer(OrderedConfig {
            deliver_policy: DeliverPolicy::ByStartTime {
                start_time: crate::scan::offset(*from),
            },
            ..Default::default()
        })
        .await?;
    let mut messages = consumer.messages().await?;
    while let Some(message) = messages.next().await {
        let message = message?;
        if let Ok(stats) = serde_json::from_slice::<HostStats>(&message.payload) {
            *from = SystemTime::UNIX_EPOCH + Duration::from_millis(stats.at_ms + 1);
            window.add(stats);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(host: &str, started: u64, at: u64, processed: u64) -> HostStats {
        let mut counts = RouteCounts::default();
        counts.outcomes.insert("processed".into(), processed);
        HostStats {
            instance_id: host.into(),
            started_ms: started,
            at_ms: at,
            routes: [("r".to_string(), counts)].into(),
            ..Default::default()
        }
    }

    #[test]
    fn counts_are_exact_for_hosts_started_in_the_window_and_differences_for_older_ones() {
        let now = now_ms();
        let w = Window::default();
        // Started inside the window: everything it counted.
        w.add(stats("a", now - 10_000, now - 6_000, 4));
        w.add(stats("a", now - 10_000, now - 3_000, 7));
        // Started long ago: only what it counted since its first snapshot in the window.
        let old = now - 2 * SPAN.as_millis() as u64;
        w.add(stats("b", old, now - 6_000, 100));
        w.add(stats("b", old, now - 1_000, 105));
        let r = &w.routes()["r"];
        assert_eq!(r.outcomes["processed"], 7 + 5);
        assert_eq!(r.series["processed"].iter().sum::<u64>(), 7 + 5);
        let hosts = w.hosts();
        assert_eq!(hosts.len(), 2);
        assert!(hosts.iter().all(|h| !h.gone));
    }

    #[test]
    fn each_step_has_its_latency_percentiles_and_pending_and_the_window_its_histogram() {
        let now = now_ms();
        let w = Window::default();
        let mut first = stats("a", now - 100_000, now - 40_000, 10);
        let mut second = stats("a", now - 100_000, now - 1_000, 20);
        let buckets = |i: usize, n: u64| {
            let mut b = vec![0; BUCKETS];
            b[i] = n;
            b
        };
        let counts = first.routes.get_mut("r").unwrap();
        counts.guest_time = buckets(4, 10); // 10 runs of (0.5, 1] ms
        counts.added_time = buckets(2, 10);
        counts.pending = 7;
        let counts = second.routes.get_mut("r").unwrap();
        counts.guest_time = buckets(4, 10);
        counts.guest_time[9] = 10; // then 10 runs of (20, 50] ms
        counts.added_time = buckets(2, 20);
        counts.pending = 3;
        w.add(first);
        w.add(second);
        let r = &w.routes()["r"];
        let points = (SPAN.as_secs() / STEP.as_secs()) as usize;
        assert_eq!(r.guest_ms.p50.len(), points);
        let measured: Vec<f64> = r.guest_ms.p50.iter().flatten().copied().collect();
        assert_eq!(measured.len(), 2, "{:?}", r.guest_ms.p50);
        assert!(measured[0] <= 1.0 && measured[1] >= 20.0, "{measured:?}");
        assert_eq!(r.pending_series.iter().filter(|p| **p > 0).count(), 2);
        assert_eq!(*r.pending_series.iter().max().unwrap(), 7);
        assert_eq!(r.guest_histogram[4], 10);
        assert_eq!(r.guest_histogram[9], 10);
        assert_eq!(r.added_histogram[2], 20);
    }

    #[test]
    fn a_host_restarted_under_the_same_id_adds_its_new_process_to_the_old_ones_counts() {
        let now = now_ms();
        let w = Window::default();
        w.add(stats("a", now - 60_000, now - 50_000, 10));
        w.add(stats("a", now - 60_000, now - 40_000, 30));
        // Restarted: counts from zero again.
        w.add(stats("a", now - 20_000, now - 10_000, 4));
        w.add(stats("a", now - 20_000, now - 2_000, 6));
        let r = &w.routes()["r"];
        assert_eq!(r.outcomes["processed"], 30 + 6);
        assert_eq!(r.series["processed"].iter().sum::<u64>(), 30 + 6);
        let hosts = w.hosts();
        assert_eq!(hosts.len(), 1, "one host, its newest process");
        assert_eq!(hosts[0].uptime_s, 20);
    }
}
