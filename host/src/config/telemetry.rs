//! `[telemetry]`: where a host's OpenTelemetry spans go. Off by default; what is not set here
//! comes from the standard `OTEL_*` environment variables.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// OpenTelemetry span export. What is not set here comes from the standard `OTEL_*`
/// variables.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// `"otlp"` exports spans over OTLP, `"none"` exports none. Unset: `OTEL_TRACES_EXPORTER`
    /// decides (`otlp` turns export on), else none. `OTEL_SDK_DISABLED=true` always wins.
    pub traces: Option<TracesExporter>,
    /// The collector, for example `http://otel-collector:4317` (gRPC) or `http://tempo:4318`
    /// (HTTP, `/v1/traces` is appended). Unset: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`, else the protocol's localhost default.
    pub endpoint: Option<String>,
    /// `"grpc"` or `"http/protobuf"`. Unset: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, then `OTEL_EXPORTER_OTLP_PROTOCOL`, else
    /// `http/protobuf`.
    pub protocol: Option<OtlpProtocol>,
    /// The `service.name` of every span. Unset: `OTEL_SERVICE_NAME`, else `dedup-host`.
    pub service_name: Option<String>,
    /// How a delivery's span relates to the producer's `traceparent`: `"parent"` continues
    /// the producer's trace; `"link"` starts a trace per delivery, linked to the producer's
    /// (for producers whose traces would otherwise grow without end).
    pub producer: ProducerRelation,
    /// Spans waiting for export, at most. Past it, spans are dropped (never waited for) and
    /// counted in `dedup_spans_dropped_total`; while it is full, new deliveries are not traced (each counted once). Default 4096.
    #[schemars(range(min = 1))]
    pub queue: usize,
    /// Spans per export request, at most. Default 512.
    #[schemars(range(min = 1))]
    pub batch: usize,
    /// Longest a finished span waits for its batch to fill before it is sent. Default 1 s.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "crate::durations::Text")]
    pub delay: Duration,
    /// Longest one export request may take before it is abandoned (its spans counted as
    /// dropped). Default 10 s.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "crate::durations::Text")]
    pub timeout: Duration,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            traces: None,
            endpoint: None,
            protocol: None,
            service_name: None,
            producer: ProducerRelation::Parent,
            queue: 4096,
            batch: 512,
            delay: Duration::from_secs(1),
            timeout: Duration::from_secs(10),
        }
    }
}

impl TelemetryConfig {
    /// Checks the section; `check(ok, field, message)` records a problem.
    pub(super) fn validate(&self, check: &mut dyn FnMut(bool, String, String)) {
        check(
            self.queue > 0,
            "telemetry.queue".into(),
            "must be at least 1 (spans waiting for export); the default is 4096".into(),
        );
        check(
            self.batch > 0 && self.batch <= self.queue.max(1),
            "telemetry.batch".into(),
            format!(
                "must be between 1 and `queue` ({}): spans per export request; the default is 512",
                self.queue
            ),
        );
        check(
            !self.delay.is_zero() && !self.timeout.is_zero(),
            "telemetry.delay".into(),
            "`delay` and `timeout` must be longer than 0 (for example \"1s\" and \"10s\")".into(),
        );
        if let Some(endpoint) = &self.endpoint {
            check(
                endpoint.starts_with("http://") || endpoint.starts_with("https://"),
                "telemetry.endpoint".into(),
                format!("`{endpoint}` is not a URL: write it with its scheme, for example \"http://otel-collector:4317\""),
            );
        }
    }

    /// Whether spans are exported, from this section and the environment (`env` reads a
    /// variable; the host passes `std::env::var`).
    pub fn exports(&self, env: impl Fn(&str) -> Option<String>) -> bool {
        if env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return false;
        }
        match self.traces {
            Some(TracesExporter::Otlp) => true,
            Some(TracesExporter::None) => false,
            None => env("OTEL_TRACES_EXPORTER")
                .is_some_and(|v| v.split(',').any(|e| e.trim().eq_ignore_ascii_case("otlp"))),
        }
    }
}

/// Where spans go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TracesExporter {
    /// OTLP, to a collector, Jaeger, Tempo...
    Otlp,
    /// Nowhere.
    None,
}

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub enum OtlpProtocol {
    /// gRPC (port 4317 by convention).
    #[serde(rename = "grpc")]
    Grpc,
    /// Protobuf over HTTP (port 4318 by convention).
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

/// How a delivery's span relates to the span that published the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProducerRelation {
    /// A child of the producer's span: one trace from producer to outputs.
    Parent,
    /// The root of its own trace, with a link to the producer's span.
    Link,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_section_names_each_field_and_its_fix() {
        let bad = TelemetryConfig {
            queue: 0,
            endpoint: Some("collector:4317".into()),
            ..TelemetryConfig::default()
        };
        let mut problems = Vec::new();
        bad.validate(&mut |ok, field, message| {
            if !ok {
                problems.push(format!("{field}: {message}"));
            }
        });
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(
            problems[2].contains("http://otel-collector:4317"),
            "{problems:?}"
        );
        let mut none = true;
        TelemetryConfig::default().validate(&mut |ok, _, _| none &= ok);
        assert!(none);
    }

    #[test]
    fn export_is_off_unless_the_section_or_the_environment_turns_it_on() {
        let none = |_: &str| None;
        let otlp = |k: &str| (k == "OTEL_TRACES_EXPORTER").then(|| "otlp".to_string());
        let disabled = |k: &str| match k {
            "OTEL_SDK_DISABLED" => Some("true".to_string()),
            _ => otlp(k),
        };
        let default = TelemetryConfig::default();
        assert!(!default.exports(none));
        assert!(default.exports(otlp));
        assert!(!default.exports(disabled));
        let on = TelemetryConfig {
            traces: Some(TracesExporter::Otlp),
            ..TelemetryConfig::default()
        };
        assert!(on.exports(none));
        assert!(!on.exports(disabled));
        let off = TelemetryConfig {
            traces: Some(TracesExporter::None),
            ..TelemetryConfig::default()
        };
        assert!(!off.exports(otlp));
    }
}
