//! The bounded queue between finished spans and the exporter. A message never waits for
//! telemetry: a span that finds the queue full is dropped and counted
//! (`dedup_spans_dropped_total`). The SDK's `BatchSpanProcessor` also drops on a full queue,
//! but keeps its count private (it logs it once, at shutdown), so the count could not be a
//! metric; exports also run on the host's runtime here, which the gRPC transport needs.
//!
//! After a failed export the collector is taken as down for a while ([`Pause`]): deliveries
//! in that time are not traced at all (counted as dropped), so a dead collector costs the
//! message path nothing, instead of building spans that would only fail to send. The pause
//! doubles with each failure in a row, from 1 s up to 30 s, and a delivery traced after it
//! probes the collector again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

/// How the queue batches spans.
#[derive(Debug, Clone, Copy)]
pub struct Batching {
    /// Spans waiting, at most.
    pub queue: usize,
    /// Spans per export, at most.
    pub batch: usize,
    /// Longest a span waits for its batch to fill.
    pub delay: Duration,
    /// Longest one export may take.
    pub timeout: Duration,
}

/// The span processor: hands each finished span to the export task, or drops and counts it.
#[derive(Debug)]
pub struct Queue {
    spans: mpsc::Sender<SpanData>,
    dropped: Counter,
    stop: Arc<Notify>,
    pause: Arc<Pause>,
}

impl Queue {
    /// A queue and its export task, which runs on the current runtime until
    /// [`SpanProcessor::shutdown`] (or the provider's), then sends what is left.
    pub fn start<E: SpanExporter + 'static>(
        exporter: E,
        batching: Batching,
        dropped: Counter,
    ) -> (Self, JoinHandle<()>) {
        let (spans, received) = mpsc::channel(batching.queue.max(1));
        let stop = Arc::new(Notify::new());
        let pause = Arc::new(Pause::new());
        let task = tokio::spawn(export(
            exporter,
            received,
            batching,
            dropped.clone(),
            stop.clone(),
            pause.clone(),
        ));
        (
            Self {
                spans,
                dropped,
                stop,
                pause,
            },
            task,
        )
    }
}

impl Queue {
    /// A handle that tells whether the queue has room, counting a delivery left untraced.
    pub fn room(&self) -> Room {
        Room {
            spans: self.spans.clone(),
            dropped: self.dropped.clone(),
            pause: self.pause.clone(),
        }
    }
}

/// Whether a delivery's spans would be queued and sent: when the queue is full (a slow
/// collector) or the collector is taken as down ([`Pause`]), a new delivery is not traced at
/// all, so building spans that would only be dropped costs the message path nothing.
#[derive(Debug, Clone)]
pub struct Room {
    spans: mpsc::Sender<SpanData>,
    dropped: Counter,
    pause: Arc<Pause>,
}

impl Room {
    /// Whether there is room; if not, counts the delivery's process span as dropped.
    pub fn take(&self) -> bool {
        if self.spans.capacity() > 0 && !self.pause.active() {
            return true;
        }
        self.dropped.inc();
        false
    }
}

/// First pause after a failed export.
const PAUSE_FIRST: Duration = Duration::from_secs(1);
/// Longest pause: a collector that comes back is used again within this.
const PAUSE_MAX: Duration = Duration::from_secs(30);

/// Until when the collector is taken as down after failed exports, readable on the message
/// path without a lock.
#[derive(Debug)]
pub struct Pause {
    start: Instant,
    /// Until when, in nanoseconds since `start` (0: not paused).
    until: AtomicU64,
    /// Failed exports in a row.
    failures: AtomicU64,
}

impl Pause {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            until: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Whether deliveries are left untraced now.
    fn active(&self) -> bool {
        self.until.load(Ordering::Relaxed) > self.now()
    }

    /// An export failed: pause for longer than the last time, and return for how long.
    fn failed(&self) -> Duration {
        let n = self.failures.fetch_add(1, Ordering::Relaxed).min(16) as u32;
        let pause = PAUSE_FIRST.saturating_mul(1 << n).min(PAUSE_MAX);
        let until = self.now().saturating_add(pause.as_nanos() as u64);
        self.until.store(until, Ordering::Relaxed);
        pause
    }

    /// An export succeeded: the next failure pauses briefly again.
    fn succeeded(&self) {
        self.failures.store(0, Ordering::Relaxed);
    }
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if self.spans.try_send(span).is_err() {
            self.dropped.inc();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        self.stop.notify_one();
        Ok(())
    }
}

/// Sends batches until stopped, then what is still queued.
async fn export<E: SpanExporter>(
    exporter: E,
    mut spans: mpsc::Receiver<SpanData>,
    b: Batching,
    dropped: Counter,
    stop: Arc<Notify>,
    pause: Arc<Pause>,
) {
    let mut warned = false;
    let mut send = async |batch: Vec<SpanData>| {
        let n = batch.len() as u64;
        let failure = match tokio::time::timeout(b.timeout, exporter.export(batch)).await {
            Ok(Ok(())) => return pause.succeeded(),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {:?}", b.timeout),
        };
        dropped.inc_by(n);
        let paused = pause.failed();
        if !std::mem::replace(&mut warned, true) {
            tracing::warn!("exporting spans failed, dropping them and tracing nothing for {paused:?}, then trying again (counted in dedup_spans_dropped_total; later failures are only counted): {failure}");
        }
    };
    let mut stopping = false;
    while !stopping {
        let first = tokio::select! {
            span = spans.recv() => span,
            () = stop.notified() => None,
        };
        let Some(first) = first else { break };
        let mut batch = vec![first];
        let until = tokio::time::Instant::now() + b.delay;
        while batch.len() < b.batch {
            tokio::select! {
                span = tokio::time::timeout_at(until, spans.recv()) => match span {
                    Ok(Some(span)) => batch.push(span),
                    Ok(None) => { stopping = true; break }
                    Err(_) => break,
                },
                () = stop.notified() => { stopping = true; break }
            }
        }
        send(batch).await;
    }
    // Stopped: what was queued before is sent, in batches.
    spans.close();
    let mut rest = Vec::new();
    while let Ok(span) = spans.try_recv() {
        rest.push(span);
        if rest.len() == b.batch {
            send(std::mem::take(&mut rest)).await;
        }
    }
    if !rest.is_empty() {
        send(rest).await;
    }
    let _ = exporter.shutdown();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_exports_pause_tracing_longer_each_time_up_to_the_maximum() {
        let pause = Pause::new();
        assert!(!pause.active());
        assert_eq!(pause.failed(), PAUSE_FIRST);
        assert!(pause.active());
        assert_eq!(pause.failed(), PAUSE_FIRST * 2);
        for _ in 0..40 {
            pause.failed();
        }
        assert_eq!(pause.failed(), PAUSE_MAX);
        pause.succeeded();
        assert_eq!(pause.failed(), PAUSE_FIRST);
        pause.until.store(0, Ordering::Relaxed);
        assert!(!pause.active(), "traced again once the pause is over");
    }
}
