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

#[test]
fn the_clock_skew_must_stay_below_the_ack_wait() {
    let with = |skew: &str, ack_wait: &str| {
        let text = format!(
            "[nats]\nurls = [\"nats://127.0.0.1:4222\"]\n[claims]\nheartbeat = \"1s\"\nlease = \"10s\"\nclock_skew = \"{skew}\"\n[source]\nsubjects = [\"in.>\"]\nack_wait = \"{ack_wait}\"\n[[routes]]\nname = \"r\"\nsubject = \"in.r.*\"\nexclusive_by = {{ subject_token = 2 }}\n"
        );
        Config::parse(&text, Path::new("t.toml"), std::env::temp_dir())
            .map_err(|e| format!("{e:#}"))
    };
    with("2s", "30s").expect("a skew below the ack wait");
    for (skew, ack_wait) in [("30s", "30s"), ("40s", "30s")] {
        let error = with(skew, ack_wait).expect_err(skew);
        assert!(
            error.contains("claims.clock_skew")
                && error.contains("source.ack_wait")
                && error.contains("lower claims.clock_skew or raise source.ack_wait"),
            "{skew}: {error}"
        );
    }
}

#[test]
fn a_url_refused_for_its_spaces_is_shown_without_its_credentials() {
    for url in [
        "nats://alice:s3cret@10.0.0.1:4222 ",
        " nats://alice:s3 cret@10.0.0.1:4222",
        "nats://alice:s3/cret@10.0.0.1:4222 x",
    ] {
        let text = format!(
            "[nats]\nurls = [\"{url}\"]\n[source]\nsubjects = [\"in.>\"]\n[[routes]]\nname = \"r\"\nsubject = \"in.r\"\n"
        );
        let error = Config::parse(&text, Path::new("t.toml"), std::env::temp_dir())
            .map(|_| ())
            .expect_err(url);
        let error = format!("{error:#}");
        assert!(error.contains("nats.urls[0]"), "{error}");
        assert!(error.contains("10.0.0.1:4222"), "names the server: {error}");
        assert!(
            !error.contains("s3") && !error.contains("alice"),
            "no credentials: {error}"
        );
    }
}

#[test]
fn a_named_deployment_has_a_reload_subject_of_its_own() {
    let with = |deployment: &str| {
        let text = format!(
            "{deployment}\n[nats]\nurls = [\"nats://127.0.0.1:4222\"]\n[source]\nstream = \"EVENTS\"\nsubjects = [\"in.>\"]\n[[routes]]\nname = \"r\"\nsubject = \"in.r\"\n"
        );
        Config::parse(&text, Path::new("t.toml"), std::env::temp_dir())
            .map_err(|e| format!("{e:#}"))
    };
    let unnamed = with("").expect("valid");
    assert_eq!(unnamed.reload_subject(), "dedup.control.reload.EVENTS");
    let named = with("[deployment]\nname = \"shop\"").expect("valid");
    assert_eq!(named.reload_subject(), "dedup.control.reload.EVENTS.shop");
    // Any other name is free text, written as one token of its own.
    let spaced = with("[deployment]\nname = \"two words\"").expect("valid");
    assert_eq!(
        spaced.reload_subject(),
        "dedup.control.reload.EVENTS.x74776f20776f726473"
    );
    let x = with("[deployment]\nname = \"x1\"").expect("valid");
    assert_eq!(x.reload_subject(), "dedup.control.reload.EVENTS.x7831");
}
