//! Outbound `https` calls from guests (issue 45): the host's TLS client checks the server's
//! certificate against the system's roots plus the route's `ca_file`, for the URL's host;
//! a certificate for another name or from an untrusted CA is an error code the guest sees;
//! an `http` URL does not pass an `https` rule; a re-run replays the journaled answer. Against
//! real local TLS endpoints whose certificates the test issues (rcgen).

use std::path::{Path, PathBuf};
use std::time::Duration;

use dedup_host::config::Config;
use dedup_host::runtime::http::CallResult;
use dedup_host::runtime::InvokeOptions;
use dedup_host_tests::endpoint::Endpoint;
use dedup_host_tests::guest_calls::{error, grant, run, Results};
use dedup_host_tests::harness::{wait_for, TestEnv, Timing};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use serde_json::{json, Value};

/// A certificate authority, its certificate written to `<dir>/<name>.pem`.
struct Ca {
    ca: CertifiedIssuer<'static, KeyPair>,
    file: PathBuf,
}

impl Ca {
    fn new(dir: &Path, name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let file = dir.join(format!("{name}.pem"));
        std::fs::write(&file, ca.pem()).unwrap();
        Self { ca, file }
    }

    /// An https endpoint with a server certificate this CA issued for `names`.
    async fn endpoint(&self, names: Vec<SanType>) -> Endpoint {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "endpoint");
        params.subject_alt_names = names;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &*self.ca).unwrap();
        Endpoint::start_tls(&cert.pem(), &key.serialize_pem()).await
    }
}

fn loopback() -> Vec<SanType> {
    vec![SanType::IpAddress("127.0.0.1".parse().unwrap())]
}

/// `[routes.http]` lines allowing https to 127.0.0.1's `/hooks/`, trusting `ca_file` if any.
fn settings(ca_file: Option<&Path>) -> String {
    let mut text = "allow = [\"https://127.0.0.1:*/hooks/*\"]\n".to_string();
    if let Some(file) = ca_file {
        text.push_str(&format!("ca_file = {:?}\n", file.display().to_string()));
    }
    text
}

#[tokio::test(flavor = "multi_thread")]
async fn https_calls_verify_the_certificate_for_the_url_host_and_an_http_url_fails_an_https_rule() {
    let dir = tempfile::tempdir().unwrap();
    let (trusted, rogue) = (Ca::new(dir.path(), "ca"), Ca::new(dir.path(), "rogue"));
    let good = trusted.endpoint(loopback()).await;
    let other_name = (trusted)
        .endpoint(vec![SanType::DnsName("elsewhere.test".try_into().unwrap())])
        .await;
    let untrusted = rogue.endpoint(loopback()).await;
    let results = Results::default();
    let options = InvokeOptions {
        http: Some(grant(&settings(Some(&trusted.file)), &results)),
        ..InvokeOptions::default()
    };
    let plain = format!("http://127.0.0.1:{}/hooks/plain", good.port());
    let got = run(
        &options,
        json!([
            { "url": format!("{}/hooks/a", good.base()), "body": "over tls" },
            { "url": format!("{}/hooks/b", other_name.base()) },
            { "url": format!("{}/hooks/c", untrusted.base()) },
            { "url": plain },
        ]),
    )
    .await;
    assert_eq!(
        (got[0]["status"].as_u64(), got[0]["body"].as_str()),
        (Some(201), Some("ok 1")),
        "a certificate the route's CA issued for the URL's host: {got:?}"
    );
    assert!(
        error(&got[1]).contains("TlsCertificateError"),
        "a certificate for another name: {got:?}"
    );
    assert!(
        error(&got[2]).contains("TlsCertificateError"),
        "a certificate no trusted root issued: {got:?}"
    );
    assert!(
        error(&got[3]).contains("HttpRequestDenied"),
        "an http URL does not pass an https rule: {got:?}"
    );
    let seen = good.seen();
    assert_eq!(seen.len(), 1, "only the https call arrived: {seen:?}");
    assert_eq!(
        (seen[0].path.as_str(), seen[0].body.as_str()),
        ("/hooks/a", "over tls")
    );
    assert_eq!(seen[0].key.as_deref(), Some("http.k.k1.call.0"));
    assert!(other_name.seen().is_empty() && untrusted.seen().is_empty());
    use CallResult::*;
    assert_eq!(*results.lock().unwrap(), [Sent, Failed, Failed, Denied]);

    // Without the route's CA, only the system's roots are trusted.
    let system_only = InvokeOptions {
        http: Some(grant(&settings(None), &Results::default())),
        ..InvokeOptions::default()
    };
    let got = run(
        &system_only,
        json!([{ "url": format!("{}/hooks/d", good.base()) }]),
    )
    .await;
    assert!(error(&got[0]).contains("TlsCertificateError"), "{got:?}");
    assert_eq!(good.seen().len(), 1);
}

#[tokio::test]
async fn an_https_call_is_sent_once_per_key_across_a_re_run() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "ca");
    let endpoint = ca.endpoint(loopback()).await;
    let env = TestEnv::start().await;
    let routes = format!(
        r#"
[[routes]]
name = "http"
subject = "in.http.*"
component = "{{guest:http-call}}"
allowed_outputs = ["in.http.*.done"]

[routes.http]
{}"#,
        settings(Some(&ca.file))
    );
    let host = env.host(&Timing::default(), &routes, "h").await;
    let url = format!("{}/hooks/notify", endpoint.base());
    let payload =
        json!({ "calls": [{ "url": url, "body": "send once" }], "retry_first_attempt": true });
    env.publish("in.http.k1", "k1", &[], payload.to_string())
        .await;
    env.wait_completed("http", &["k1"], Duration::from_secs(60))
        .await;
    let out = wait_for(Duration::from_secs(60), "the output", || async {
        env.outputs()
            .await
            .into_iter()
            .find(|m| m.subject.as_str() == "in.http.k1.done")
    })
    .await;
    let got: Vec<Value> = serde_json::from_slice(&out.payload).unwrap();
    assert_eq!(
        (got[0]["status"].as_u64(), got[0]["body"].as_str()),
        (Some(201), Some("ok 1")),
        "the second run got the first run's answer: {got:?}"
    );
    assert_eq!(env.claim("http", "k1").await.unwrap().attempt, 2);
    let per_key = endpoint.per_key();
    assert_eq!(
        per_key.get("http.k.k1.call.0"),
        Some(&1),
        "sent once across two runs: {per_key:?}"
    );
    host.shutdown().await.unwrap();
}

/// Parses a minimal config whose route has `[routes.http]` lines `http`.
fn parse(http: &str, dir: &Path) -> Result<Config, String> {
    let text = format!(
        "[nats]\nurls = [\"nats://127.0.0.1:4222\"]\n[source]\nsubjects = [\"in.>\"]\n[[routes]]\nname = \"r\"\nsubject = \"in.r\"\n[routes.http]\n{http}"
    );
    Config::parse(&text, Path::new("t.toml"), dir.to_path_buf()).map_err(|e| format!("{e:#}"))
}

#[test]
fn a_ca_file_is_read_at_config_load_relative_to_the_config() {
    let dir = tempfile::tempdir().unwrap();
    Ca::new(dir.path(), "ca");
    std::fs::write(dir.path().join("notes.txt"), "not a certificate").unwrap();
    let allow = "allow = [\"https://api.example.com\"]\n";
    parse(&format!("{allow}ca_file = \"ca.pem\"\n"), dir.path()).expect("a PEM CA file");
    for (file, why) in [
        ("missing.pem", "cannot read"),
        ("notes.txt", "no `-----BEGIN"),
    ] {
        let e = parse(&format!("{allow}ca_file = \"{file}\"\n"), dir.path()).unwrap_err();
        assert!(
            e.contains("routes[0].http.ca_file") && e.contains(why) && e.contains("PEM file"),
            "{file}: {e}"
        );
    }
}

/// A `ca_file` that became unreadable after the config was validated (deleted before the
/// routes are built, as by a start or a reload): the route is refused with an error naming
/// it, the file and the fix, never served without its grant (every call denied, unexplained).
#[test]
fn a_ca_file_gone_after_validation_refuses_the_route_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "ca");
    let config =
        parse(&settings(Some(&ca.file)), dir.path()).expect("valid while the file is there");
    std::fs::remove_file(&ca.file).unwrap();
    let Err(refused) = dedup_host::routes::Routes::unloaded(&config) else {
        panic!("the route is refused, not served without its grant");
    };
    let refused = refused.to_string();
    let file = ca.file.display().to_string();
    assert!(
        refused.contains("route `r`")
            && refused.contains(&file)
            && refused.contains("ca_file")
            && refused.contains("readable PEM file"),
        "{refused}"
    );
}
