//! The environment variables a host reads: the ones that stand in for a flag (from clap's
//! command tree) and the ones read directly (listed here; a test checks the list against the
//! sources).

use std::collections::BTreeMap;

use clap::Command;

/// Variables the host reads that no flag names, with what they do.
pub const DIRECT: &[(&str, &str)] = &[
    (
        "DEDUP_CONSOLE_TOKEN",
        "The console's login token; wins over `[console] token`.",
    ),
    (
        "DEDUP_CONSOLE_USER",
        "The console's login user (with `DEDUP_CONSOLE_PASSWORD`); wins over `[console] user`.",
    ),
    (
        "DEDUP_CONSOLE_PASSWORD",
        "The password of `DEDUP_CONSOLE_USER`; wins over `[console] password`.",
    ),
    (
        "DEDUP_CONSOLE_HOSTS",
        "Host names (comma separated) the console answers to besides the address it listens on: requests with any other `Host` header are refused.",
    ),
    (
        "OTEL_TRACES_EXPORTER",
        "`otlp` turns span export on when `[telemetry] traces` is unset.",
    ),
    (
        "OTEL_SDK_DISABLED",
        "`true` turns span export off, whatever the config says.",
    ),
    (
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "The collector, when `[telemetry] endpoint` is unset (before `OTEL_EXPORTER_OTLP_ENDPOINT`).",
    ),
    (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "The collector, when neither `[telemetry] endpoint` nor `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set.",
    ),
    (
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "`grpc` or `http/protobuf`, when `[telemetry] protocol` is unset (before `OTEL_EXPORTER_OTLP_PROTOCOL`).",
    ),
    (
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "`grpc` or `http/protobuf`, when neither the config nor `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` says.",
    ),
    (
        "OTEL_SERVICE_NAME",
        "The spans' `service.name` when `[telemetry] service_name` is unset.",
    ),
    (
        "RUST_LOG",
        "Log filter, e.g. `dedup_host=debug`: when unset, problems only (and, for `dev`, each version swap).",
    ),
    (
        "HOSTNAME",
        "Recorded as the host name of a running host and of a `setup --change-route` run (who holds a change).",
    ),
    (
        "USER",
        "Recorded as who ran an operator command (activity, a change run's mark); `LOGNAME` when unset.",
    ),
    ("LOGNAME", "Who ran an operator command when `USER` is unset."),
];

/// Every variable, by name: those of flags (with the flags they stand for) and [`DIRECT`].
pub fn variables(commands: &[(String, &Command)]) -> BTreeMap<String, String> {
    let mut flags: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (path, command) in commands {
        for arg in command.get_arguments() {
            if let Some(env) = arg.get_env() {
                let name = env.to_string_lossy().into_owned();
                let used = format!("{} of `{path}`", super::flag(arg));
                flags.entry(name).or_default().push(used);
            }
        }
    }
    let mut all: BTreeMap<String, String> = flags
        .into_iter()
        .map(|(name, uses)| {
            let flags: std::collections::BTreeSet<&str> =
                uses.iter().filter_map(|u| u.split(" of ").next()).collect();
            let text = match (uses.len() > 3, flags.len() == 1) {
                (true, true) => format!(
                    "Stands in for {} of every command that takes it ({} commands).",
                    flags.iter().next().copied().unwrap_or(""),
                    uses.len()
                ),
                _ => format!("Stands in for {}.", uses.join(", ")),
            };
            (name, text)
        })
        .collect();
    for (name, what) in DIRECT {
        all.insert(name.to_string(), what.to_string());
    }
    all
}
