//! What guests may call: the `log` and `config` imports of `dedup:handler@0.1.0`.

use crate::bindings::dedup::handler::{config, log, types};
use crate::outcome::{level_name, LogLine, TrapKind};
use crate::state::GuestState;
use dedup_delivery::text;

impl types::Host for GuestState {}

impl log::Host for GuestState {
    fn log(
        &mut self,
        level: log::Level,
        message: String,
        fields: Vec<(String, String)>,
    ) -> wasmtime::Result<()> {
        let bytes = message.len() + fields.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        self.log_bytes += bytes as u64;
        if self.logs.len() >= self.limits.max_log_lines
            || self.log_bytes > self.limits.max_log_bytes
        {
            let (lines, bytes) = (self.limits.max_log_lines, self.limits.max_log_bytes);
            return Err(self.breach(
                TrapKind::LogLimit,
                format!("guest logged past its budget of {lines} lines / {bytes} bytes"),
            ));
        }
        let ctx = &self.context;
        let level_str = level_name(level);
        // Escaped, so an embedded newline cannot forge a host log line.
        let shown = text::escape_controls(&message);
        let fields_shown: Vec<(String, String)> = fields
            .iter()
            .map(|(k, v)| (text::escape_controls(k), text::escape_controls(v)))
            .collect();
        match level {
            log::Level::Trace => {
                tracing::trace!(target: "guest", route = %ctx.route, key = ?ctx.key, attempt = ctx.attempt, fields = ?fields_shown, "{shown}")
            }
            log::Level::Debug => {
                tracing::debug!(target: "guest", route = %ctx.route, key = ?ctx.key, attempt = ctx.attempt, fields = ?fields_shown, "{shown}")
            }
            log::Level::Info => {
                tracing::info!(target: "guest", route = %ctx.route, key = ?ctx.key, attempt = ctx.attempt, fields = ?fields_shown, "{shown}")
            }
            log::Level::Warn => {
                tracing::warn!(target: "guest", route = %ctx.route, key = ?ctx.key, attempt = ctx.attempt, fields = ?fields_shown, "{shown}")
            }
            log::Level::Error => {
                tracing::error!(target: "guest", route = %ctx.route, key = ?ctx.key, attempt = ctx.attempt, fields = ?fields_shown, "{shown}")
            }
        }
        self.logs.push(LogLine {
            level: level_str,
            message,
            fields,
        });
        Ok(())
    }
}

impl config::Host for GuestState {
    fn get(&mut self, key: String) -> wasmtime::Result<Option<String>> {
        Ok(self.config.get(&key).cloned())
    }

    fn get_all(&mut self) -> wasmtime::Result<Vec<(String, String)>> {
        Ok(self
            .config
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}
