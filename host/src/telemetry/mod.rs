//! OpenTelemetry traces over OTLP (`[telemetry]`, off by default): one `process <subject>`
//! CONSUMER span per delivery, with child spans for the claim, the guest call, each output's
//! `send` and the `settle` ([`Trace`]), and a CLIENT span per outbound HTTP call
//! ([`client`]). Spans follow the messaging semantic conventions;
//! NATS is not in their `messaging.system` list yet, so it is `nats`, as nats.net reports it.
//! Exporting never slows a message: spans go through a bounded [`queue`], dropped and
//! counted when it is full.

pub mod client;
mod queue;
mod span;

use std::sync::Arc;

use anyhow::Context as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use prometheus_client::metrics::counter::Counter;
use tokio::task::JoinHandle;

use crate::config::telemetry::{OtlpProtocol, ProducerRelation, TelemetryConfig};
pub use queue::Batching;
pub use span::{record_outcome, Child, Trace};

/// The `messaging.system` of every span.
pub const MESSAGING_SYSTEM: &str = "nats";

/// A host's span source: what starts each delivery's [`Trace`].
#[derive(Debug, Clone)]
pub struct Tracer {
    inner: SdkTracer,
    producer: ProducerRelation,
    room: queue::Room,
}

/// A running exporter: its tracer, and what [`Telemetry::shutdown`] flushes.
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
    tracer: Arc<Tracer>,
    task: JoinHandle<()>,
}

impl Telemetry {
    /// Starts exporting if `config` (or the `OTEL_*` environment) asks for it; `None` when
    /// traces are off. `dropped` counts the spans dropped on a full queue or a failed export.
    /// Must run inside the host's runtime (the exports run on it).
    pub fn start(
        config: &TelemetryConfig,
        instance_id: &str,
        dropped: Counter,
    ) -> anyhow::Result<Option<Self>> {
        if !config.exports(|k| std::env::var(k).ok()) {
            return Ok(None);
        }
        let exporter =
            exporter(config).context("cannot set up the OTLP span exporter ([telemetry])")?;
        let batching = Batching {
            queue: config.queue,
            batch: config.batch,
            delay: config.delay,
            timeout: config.timeout,
        };
        let (queue, task) = queue::Queue::start(exporter, batching, dropped);
        let room = queue.room();
        let service = config
            .service_name
            .clone()
            .or_else(|| std::env::var("OTEL_SERVICE_NAME").ok())
            .unwrap_or_else(|| "dedup-host".into());
        let resource = Resource::builder()
            .with_service_name(service)
            .with_attributes([
                opentelemetry::KeyValue::new("service.instance.id", instance_id.to_string()),
                opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            ])
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(queue)
            .with_resource(resource)
            .build();
        let tracer = Arc::new(Tracer {
            inner: provider.tracer("dedup-host"),
            producer: config.producer,
            room,
        });
        Ok(Some(Self {
            provider,
            tracer,
            task,
        }))
    }

    /// The tracer the message loops start spans with.
    pub fn tracer(&self) -> Arc<Tracer> {
        self.tracer.clone()
    }

    /// Stops the queue and waits (a few seconds at most) for what it holds to be sent.
    pub async fn shutdown(self) {
        let _ = self.provider.shutdown();
        let waited = tokio::time::timeout(std::time::Duration::from_secs(5), self.task).await;
        if waited.is_err() {
            tracing::warn!("spans still queued at shutdown were not all sent within 5 s");
        }
    }
}

/// The OTLP exporter `config` and the environment describe.
fn exporter(config: &TelemetryConfig) -> anyhow::Result<opentelemetry_otlp::SpanExporter> {
    let builder = opentelemetry_otlp::SpanExporter::builder();
    let timeout = config.timeout;
    let exporter = match config.protocol {
        Some(OtlpProtocol::Grpc) => {
            let mut b = builder.with_tonic().with_timeout(timeout);
            if let Some(endpoint) = &config.endpoint {
                b = b.with_endpoint(endpoint.clone());
            }
            b.build()?
        }
        Some(OtlpProtocol::HttpProtobuf) => {
            let mut b = builder
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_timeout(timeout);
            if let Some(endpoint) = &config.endpoint {
                b = b.with_endpoint(http_traces_endpoint(endpoint));
            }
            b.build()?
        }
        // The environment picks the protocol; an endpoint set here still applies.
        None => match (&config.endpoint, grpc_from_env()) {
            (None, _) => builder.build()?,
            (Some(e), true) => builder.with_tonic().with_endpoint(e.clone()).build()?,
            (Some(e), false) => builder
                .with_http()
                .with_endpoint(http_traces_endpoint(e))
                .build()?,
        },
    };
    Ok(exporter)
}

/// Whether `OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL` asks for gRPC.
fn grpc_from_env() -> bool {
    [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ]
    .iter()
    .find_map(|k| std::env::var(k).ok())
    .is_some_and(|p| p.trim() == "grpc")
}

/// An HTTP endpoint set in the config is the collector's base address, like
/// `OTEL_EXPORTER_OTLP_ENDPOINT`: the traces path is appended unless it is there already.
fn http_traces_endpoint(endpoint: &str) -> String {
    let base = endpoint.trim_end_matches('/');
    match base.ends_with("/v1/traces") {
        true => base.to_string(),
        false => format!("{base}/v1/traces"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_http_endpoint_gets_the_traces_path_once() {
        assert_eq!(
            http_traces_endpoint("http://tempo:4318"),
            "http://tempo:4318/v1/traces"
        );
        assert_eq!(
            http_traces_endpoint("http://tempo:4318/v1/traces/"),
            "http://tempo:4318/v1/traces"
        );
    }
}
