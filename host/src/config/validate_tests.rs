//! Unit tests of the config checks that join several keys.

use std::path::Path;

use crate::config::Config;

/// Parses a minimal config with `host` lines in `[host]`.
fn parse(host: &str) -> Result<Config, String> {
    let text = format!(
        "[nats]\nurls = [\"nats://127.0.0.1:4222\"]\n[host]\n{host}\n[source]\nsubjects = [\"in.>\"]\n[[routes]]\nname = \"r\"\nsubject = \"in.r\"\n"
    );
    Config::parse(&text, Path::new("t.toml"), std::env::temp_dir()).map_err(|e| format!("{e:#}"))
}

#[test]
fn an_inbox_prefix_is_one_token_so_no_other_prefix_covers_it() {
    let with = |prefix: &str| {
        let text = format!(
            "[nats]\nurls = [\"nats://127.0.0.1:4222\"]\ninbox_prefix = \"{prefix}\"\n[source]\nsubjects = [\"in.>\"]\n[[routes]]\nname = \"r\"\nsubject = \"in.r\"\n"
        );
        Config::parse(&text, Path::new("t.toml"), std::env::temp_dir())
            .map_err(|e| format!("{e:#}"))
    };
    with("_INBOX_orders").expect("one token");
    for prefix in ["_INBOX.orders", "_INBOX_orders.", "orders.*"] {
        let error = with(prefix).expect_err(prefix);
        assert!(
            error.contains("nats.inbox_prefix") && error.contains("one subject token"),
            "{prefix}: {error}"
        );
    }
}

#[test]
fn the_drain_timeout_must_exceed_the_shutdown_grace_it_includes() {
    parse("").expect("the defaults fit");
    parse("shutdown_grace = \"5s\"\ndrain_timeout = \"6s\"").expect("above the grace");
    for host in [
        "shutdown_grace = \"20s\"\ndrain_timeout = \"10s\"",
        "shutdown_grace = \"10s\"\ndrain_timeout = \"10s\"",
        "drain_timeout = \"5s\"",
    ] {
        let error = parse(host).expect_err(host);
        assert!(
            error.contains("host.drain_timeout")
                && error.contains("host.shutdown_grace")
                && error.contains("raise host.drain_timeout above host.shutdown_grace"),
            "{host}: {error}"
        );
    }
}
