//! The bounded queue between finished spans and the exporter. A message never waits for
//! telemetry: a span that finds the queue full is dropped and counted
//! (`dedup_spans_dropped_total`). The SDK's `BatchSpanProcessor` also drops on a full queue,
//! but keeps its count private (it logs it once, at shutdown), so the count could not be a
//! metric; exports also run on the host's runtime here, which the gRPC transport needs.

use std::sync::Arc;
use std::time::Duration;

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
        let task = tokio::spawn(export(
            exporter,
            received,
            batching,
            dropped.clone(),
            stop.clone(),
        ));
        (
            Self {
                spans,
                dropped,
                stop,
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
        }
    }
}

/// Whether a delivery's spans would be queued: when the queue is full (a slow or dead
/// collector), a new delivery is not traced at all, so building spans that would only be
/// dropped costs the message path nothing.
#[derive(Debug, Clone)]
pub struct Room {
    spans: mpsc::Sender<SpanData>,
    dropped: Counter,
}

impl Room {
    /// Whether there is room; if not, counts the delivery's process span as dropped.
    pub fn take(&self) -> bool {
        if self.spans.capacity() > 0 {
            return true;
        }
        self.dropped.inc();
        false
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
) {
    let mut warned = false;
    let mut send = async |batch: Vec<SpanData>| {
        let n = batch.len() as u64;
        let failure = match tokio::time::timeout(b.timeout, exporter.export(batch)).await {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {:?}", b.timeout),
        };
        dropped.inc_by(n);
        if !std::mem::replace(&mut warned, true) {
            tracing::warn!("exporting spans failed, dropping them (counted in dedup_spans_dropped_total; later failures are only counted): {failure}");
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
