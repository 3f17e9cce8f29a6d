//! Log output: human-readable text or JSON lines on stderr, written by a background thread so
//! that a slow terminal or log shipper never blocks the I/O runtime.

use tracing_appender::non_blocking::WorkerGuard;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// The filter when `RUST_LOG` is unset: problems only (`run` and every other command).
pub const DEFAULT_FILTER: &str = "warn";

/// The filter of `dedup-host dev` when `RUST_LOG` is unset: problems, and each version of a
/// handler it starts serving (a developer's rebuild landing), but not a line per message,
/// which floods an inner loop; `RUST_LOG=dedup_host=info` adds each message's outcome.
pub const DEV_FILTER: &str = "warn,dedup_host::components=info";

/// Installs the process's log subscriber. Keep the guard until the process ends: dropping it
/// flushes the lines still queued.
pub fn init(format: LogFormat) -> WorkerGuard {
    init_with_default(format, DEFAULT_FILTER)
}

/// Like [`init`], with `default` as the filter when `RUST_LOG` is unset (`dedup-host dev`
/// passes [`DEV_FILTER`]).
pub fn init_with_default(format: LogFormat, default: &str) -> WorkerGuard {
    let (writer, guard) = tracing_appender::non_blocking(std::io::stderr());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    let installed = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
    // Already installed (a second host in one process, tests): keep the first.
    drop(installed);
    guard
}

/// The trace id of a W3C `traceparent` header value (`00-<trace id>-<parent id>-<flags>`).
pub fn trace_id(traceparent: &str) -> Option<&str> {
    let mut parts = traceparent.trim().split('-');
    let (_version, id) = (parts.next()?, parts.next()?);
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_trace_id_of_a_traceparent() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            super::trace_id(tp),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert_eq!(super::trace_id("garbage"), None);
        assert_eq!(super::trace_id("00-xyz-1-01"), None);
    }
}
