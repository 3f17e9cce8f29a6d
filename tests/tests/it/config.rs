//! Configuration mistakes: each class is refused with a message naming the field.

use std::path::Path;

use dedup_host::config::{Config, ConfigError};
use dedup_host_tests::guests::guest;

const GOOD: &str = r#"
[nats]
urls = ["nats://127.0.0.1:4222"]

[source]
subjects = ["orders.*"]

[[routes]]
name = "orders"
subject = "orders.*"
component = "{upper}"
"#;

fn good() -> String {
    GOOD.replace("{upper}", &guest("uppercase").display().to_string())
}

fn problems(text: &str) -> String {
    match Config::parse(text, Path::new("bad.toml"), ".".into()) {
        Ok(_) => panic!("config should be refused:\n{text}"),
        Err(e) => {
            let shown = e.to_string();
            assert!(shown.contains("bad.toml"), "names the file: {shown}");
            shown
        }
    }
}

#[test]
fn the_good_config_is_accepted_with_defaults() {
    let c = Config::parse(&good(), Path::new("ok.toml"), ".".into()).expect("valid");
    assert_eq!(c.claims.max_age.as_secs(), 24 * 3600);
    assert_eq!(
        c.routes[0].key,
        dedup_host::config::KeySource::Header("Nats-Msg-Id".into())
    );
}

#[test]
fn each_class_of_mistake_names_its_field() {
    let cases: &[(&str, &str, &str)] = &[
        // (replace this, with this, expect this in the message)
        ("[source]", "[source]\nack_wait = \"1s\"", "source.ack_wait"),
        ("[source]", "[claims]\nlease = \"5s\"\nheartbeat = \"2s\"\n[source]", "claims.lease"),
        ("[source]", "[claims]\nreplicas = 2\n[source]", "claims.replicas"),
        ("[source]", "[source]\nbackoff = []", "source.backoff"),
        ("[source]", "[source]\nmax_deliver = 0", "source.max_deliver"),
        ("[nats]", "[nats]\nuser = \"u\"", "nats.password"),
        ("[nats]", "[nats]\ntoken = \"t\"\nnkey_seed = \"SUABC\"", "choose one authentication method"),
        ("[nats]", "[nats]\ntls_cert = \"/nope/cert.pem\"\ntls_key = \"/nope/key.pem\"", "nats.tls_cert"),
        ("name = \"orders\"", "name = \"or ders\"", "routes[0].name"),
        ("subject = \"orders.*\"\ncomponent", "subject = \"orders..x\"\ncomponent", "routes[0].subject"),
        ("subject = \"orders.*\"\ncomponent", "subject = \"payments.*\"\ncomponent", "not covered by source.subjects"),
        ("component = \"", "component = \"/missing/x.wasm\"\n# \"", "routes[0].component"),
        ("name = \"orders\"", "name = \"orders\"\nkey = { json_pointer = \"id\" }", "routes[0].key.json_pointer"),
        ("name = \"orders\"", "name = \"orders\"\nkey = { subject_token = 4 }", "routes[0].key.subject_token"),
        ("[source]", "[[output_streams]]\nname = \"OUT\"\nsubjects = [\"x.>\"]\nduplicate_window = \"10s\"\n[source]", "output_streams[0].duplicate_window"),
        ("[source]", "[dead_letter]\nsubject = \"orders.dead\"\n[source]", "dead_letter.subject"),
        ("name = \"orders\"", "name = \"orders\"\nallowed_outputs = [\"out..x\"]", "routes[0].allowed_outputs[0]"),
        ("name = \"orders\"", "name = \"orders\"\nread_only_dir = \"/no/such/dir\"", "routes[0].read_only_dir"),
        ("name = \"orders\"", "name = \"orders\"\nlimits = { fuel = 0 }", "routes[0].limits.fuel"),
        ("name = \"orders\"", "name = \"orders\"\npermanent_traps = [\"sometimes\"]", "unknown variant `sometimes`"),
        ("name = \"orders\"", "name = \"orders\"\nconcurrency = 0", "routes[0].concurrency"),
        ("[source]", "[host]\nlong_running_lanes = 0\n[source]", "host.long_running_lanes"),
        // The sandbox boundary: no output pattern reaches the server's namespaces, loops back
        // into the route, or forges dead letters.
        ("name = \"orders\"", "name = \"orders\"\nallowed_outputs = [\">\"]", "reserved namespaces"),
        ("name = \"orders\"", "name = \"orders\"\nallowed_outputs = [\"$JS.API.>\"]", "reserved namespaces"),
        ("name = \"orders\"", "name = \"orders\"\nallowed_outputs = [\"*.API.STREAM.>\"]", "reserved namespaces"),
        ("name = \"orders\"", "name = \"orders\"\nallowed_outputs = [\"orders.>\"]", "own subject"),
        ("name = \"orders\"", "name = \"orders\"\nallowed_outputs = [\"dedup.*\"]", "dead-letter subject"),
        ("[source]", "[dead_letter]\nsubject = \"$JS.dead\"\n[source]", "dead_letter.subject"),
        // Stream names and subjects that collide.
        ("[source]", "[dead_letter]\nstream = \"DEDUP_EVENTS\"\n[source]", "dead_letter.stream"),
        ("[source]", "[[output_streams]]\nname = \"DEDUP_DEAD\"\nsubjects = [\"x.>\"]\n[source]", "output_streams[0].name"),
        ("[source]", "[[output_streams]]\nname = \"OUT\"\nsubjects = [\"orders.>\"]\n[source]", "overlaps source subject"),
        ("[source]", "[[output_streams]]\nname = \"OUT\"\nsubjects = [\"dedup.>\"]\n[source]", "dead-letter subject"),
        // The duplicate-window rules, now with the route's deadline and the pause margin.
        ("[source]", "[[output_streams]]\nname = \"OUT\"\nsubjects = [\"x.>\"]\nduplicate_window = \"2m\"\n[source]", "largest route limits.wall"),
        ("[source]", "[dead_letter]\nduplicate_window = \"30s\"\n[source]", "dead_letter.duplicate_window"),
        ("[source]", "[source]\nserver_max_deliver = 6", "source.server_max_deliver"),
        ("[source]", "[source]\nreplicas = 2", "source.replicas"),
        ("[source]", "[components]\nreplicas = 4\n[source]", "components.replicas"),
    ];
    for (from, to, expected) in cases {
        let text = good().replacen(from, to, 1);
        let shown = problems(&text);
        assert!(
            shown.contains(expected),
            "expected `{expected}` in:\n{shown}"
        );
    }
}

#[test]
fn all_problems_are_reported_at_once() {
    let text = good()
        .replace("[source]", "[source]\nmax_deliver = 0\nbackoff = []")
        .replace("name = \"orders\"", "name = \"a b\"");
    let shown = problems(&text);
    for field in ["source.max_deliver", "source.backoff", "routes[0].name"] {
        assert!(shown.contains(field), "{field} missing from:\n{shown}");
    }
    match Config::parse(&text, Path::new("bad.toml"), ".".into()) {
        Err(ConfigError::Invalid { problems, .. }) => assert_eq!(problems.len(), 3),
        other => panic!("{other:?}"),
    }
}

#[test]
fn unknown_fields_and_bad_values_name_the_field() {
    let shown = problems(&good().replace("[source]", "[source]\nack_wiat = \"5s\""));
    assert!(shown.contains("ack_wiat"), "{shown}");
    let shown = problems(&good().replace("[source]", "[source]\nack_wait = \"soon\""));
    assert!(shown.contains("ack_wait"), "{shown}");
    let shown = problems(&good().replace("[source]", "[source]\nbackoff = [\"1 fortnight\"]"));
    assert!(
        shown.contains("backoff") && shown.contains("fortnight"),
        "{shown}"
    );
    assert!(matches!(
        Config::load(Path::new("/nope.toml")),
        Err(ConfigError::Read { .. })
    ));
}

#[test]
fn fenced_and_claim_after_routes_are_refused_where_they_cannot_hold() {
    // A fenced route with no fenced stream capturing its outputs.
    let text = good().replace(
        "component =",
        "allowed_outputs = [\"orders.*.done\"]\neffects = \"fenced\"\ncomponent =",
    );
    let shown = problems(&text);
    assert!(shown.contains("routes[0].effects"), "{shown}");
    assert!(
        shown.contains("add `effects = \"fenced\"` to the output stream"),
        "{shown}"
    );
    // Fixed by a fenced output stream that captures them; its 1 s window is then no problem.
    let fixed = format!(
        "{text}\n[[output_streams]]\nname = \"OUT\"\nsubjects = [\"orders.*.done\"]\nduplicate_window = \"1s\"\neffects = \"fenced\"\n"
    );
    let c = Config::parse(&fixed, Path::new("ok.toml"), ".".into()).expect("valid");
    assert_eq!(c.fenced_stream(&c.routes[0]).unwrap().name, "OUT");
    // Forever and fenced at once.
    // (the output stream is the last table)
    let both = format!("{fixed}dedup = \"forever\"\n");
    assert!(problems(&both).contains("output_streams[0].dedup"));

    // Claim-after with a long deadline, and with fenced effects.
    let after = good().replace("component =", "claim = \"after\"\ncomponent =");
    let shown = problems(&after);
    assert!(
        shown.contains("routes[0].claim") && shown.contains("at most 5s"),
        "{shown}"
    );
    let short = after.replace(
        "claim = \"after\"",
        "claim = \"after\"\nlimits = { deadline = \"1s\" }",
    );
    Config::parse(&short, Path::new("ok.toml"), ".".into())
        .expect("a short claim-after route is valid");
    let fenced_after = fixed.replace(
        "effects = \"fenced\"\ncomponent",
        "effects = \"fenced\"\nclaim = \"after\"\nlimits = { deadline = \"1s\" }\ncomponent",
    );
    assert!(problems(&fenced_after).contains("no claim to fence"));
}

/// The first hour's error texts (issue 26): each names the thing and the fix, and none points
/// inside this repository or repeats its cause.
#[test]
fn first_hour_errors_name_the_thing_and_the_fix() {
    let sized = good().replace(
        "component = ",
        "limits = { memory_bytes = \"64MiB\", max_output_bytes = \"512KiB\" }\nmax_payload_bytes = \"1 MB\"\ncomponent = ",
    );
    let c = Config::parse(&sized, Path::new("ok.toml"), ".".into()).expect("sizes with units");
    assert_eq!(c.routes[0].limits.memory_bytes, 64 << 20);
    assert_eq!(c.routes[0].limits.max_output_bytes, 512 << 10);
    assert_eq!(c.routes[0].max_payload_bytes, 1_000_000);
    let shown =
        problems(&good().replace("component = ", "max_payload_bytes = \"lots\"\ncomponent = "));
    assert!(shown.contains("\"64MiB\""), "{shown}");

    let shown = problems(&good().replace("[source]", "[source]\nack_wait = \"soon\""));
    assert!(
        shown.contains("`soon` is not a duration") && shown.contains("\"30s\""),
        "{shown}"
    );
    let shown = problems(&good().replace("subject = \"orders.*\"", "subject = \"orders.#\""));
    assert!(
        shown.contains("`orders.#` is not a valid subject filter: `#` is MQTT's wildcard"),
        "{shown}"
    );
    let shown =
        problems(&good().replace(&guest("uppercase").display().to_string(), "not-built.wasm"));
    assert!(
        shown.contains("build its project with `dedup-host build`") && !shown.contains("build.sh"),
        "{shown}"
    );

    let runtime = dedup_host::runtime::Runtime::new(&Default::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let missing = runtime
        .load_file(&dir.path().join("greeter.wasm"))
        .unwrap_err();
    let shown = dedup_host::text::error_chain(&anyhow::Error::new(missing));
    assert_eq!(shown.matches("os error 2").count(), 1, "{shown}");
    assert!(
        shown.contains("build it with `dedup-host build`"),
        "{shown}"
    );
    let text = dir.path().join("notes.wasm");
    std::fs::write(&text, "hello").unwrap();
    let shown = runtime.load_file(&text).unwrap_err().to_string();
    assert!(
        shown.contains("`dedup-host build`") && !shown.contains("build.sh"),
        "{shown}"
    );
}

/// `--config` and `--nats-url` go after a nested subcommand too, and a refused connection
/// names where the URL came from, with its cause once.
#[test]
fn global_flags_follow_the_subcommand_and_the_url_origin_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host.toml");
    std::fs::write(&path, good()).unwrap();
    let out = std::process::Command::new(dedup_host_tests::guests::host_binary())
        .args(["dead-letters", "list", "--config"])
        .arg(&path)
        .args(["-s", "nats://127.0.0.1:1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "cannot connect to NATS at nats://127.0.0.1:1 (from --nats-url or DEDUP_HOST_NATS_URL)"
        ),
        "{stderr}"
    );
    assert!(stderr.matches("refused").count() <= 1, "{stderr}");
    assert!(!stderr.contains("unexpected argument"), "{stderr}");
}
