//! TLS and NKey authentication against real nats-servers (issue 47), with a CA and
//! certificates made in the test: server TLS verified with `nats.tls_ca`, mutual TLS with
//! `tls_cert`/`tls_key`, and a wrong CA, an expired certificate and a missing client
//! certificate refused with an error that says what to check.

use std::path::{Path, PathBuf};

use dedup_host::config::Config;
use dedup_host::serve;
use dedup_host_tests::guests::guest;
use dedup_host_tests::nats::NatsServer;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

/// A certificate authority and the files it issued, in a temp dir.
struct Pki {
    dir: tempfile::TempDir,
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    /// A new CA named `name`, its certificate written to `<name>.pem`.
    fn new(name: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self::in_dir(dir, name)
    }

    fn in_dir(dir: tempfile::TempDir, name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        std::fs::write(dir.path().join(format!("{name}.pem")), ca.pem()).unwrap();
        Self { dir, ca }
    }

    /// Another CA in the same dir (what the server's certificate was not signed by).
    fn other_ca(self, name: &str) -> (Self, PathBuf) {
        let other = Pki::new(name);
        let path = self.path(&format!("{name}.pem"));
        std::fs::copy(other.path(&format!("{name}.pem")), &path).unwrap();
        (self, path)
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// Issues `<name>.pem` and `<name>-key.pem`: a server certificate for 127.0.0.1 and
    /// localhost, or a client certificate; valid now, or expired in 2021.
    fn issue(&self, name: &str, client: bool, expired: bool) -> (PathBuf, PathBuf) {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        if client {
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        } else {
            params.subject_alt_names = vec![
                SanType::IpAddress("127.0.0.1".parse().unwrap()),
                SanType::DnsName("localhost".try_into().unwrap()),
            ];
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        }
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &*self.ca).unwrap();
        let (cert_path, key_path) = (
            self.path(&format!("{name}.pem")),
            self.path(&format!("{name}-key.pem")),
        );
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    /// Starts nats-server with TLS from `server` (a certificate this CA issued); with
    /// `verify`, it asks clients for a certificate this CA issued.
    fn server(&self, server: &str, verify: bool) -> NatsServer {
        let conf = format!(
            "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: {verify}\n  timeout: 5\n}}\n",
            self.path(&format!("{server}.pem")).display(),
            self.path(&format!("{server}-key.pem")).display(),
            self.path("ca.pem").display(),
        );
        let path = self.path(&format!("{server}.conf"));
        std::fs::write(&path, conf).unwrap();
        NatsServer::start_with(&["-c", &path.display().to_string()])
    }
}

/// A host config for the server at `url` with the `[nats]` lines `nats` (paths relative to
/// `dir`).
fn config(url: &str, nats: &str, dir: &Path) -> Config {
    let text = format!(
        r#"
[nats]
urls = ["{url}"]
{nats}
[source]
subjects = ["a.*"]
[[routes]]
name = "a"
subject = "a.*"
component = "{component}"
"#,
        component = guest("uppercase").display()
    );
    Config::parse(&text, Path::new("tls.toml"), dir.into()).expect("valid")
}

/// Starts a host, expecting it to be refused; the error's whole chain.
async fn refused(config: Config) -> String {
    let err = serve::start(config).await.err().expect("refused");
    format!("{err:#}")
}

#[tokio::test]
async fn server_tls_is_verified_with_the_configured_ca() {
    let pki = Pki::new("ca");
    pki.issue("server", false, false);
    let server = pki.server("server", false);
    let host = serve::start(config(&server.url(), "tls_ca = \"ca.pem\"", pki.dir.path()))
        .await
        .expect("the server's certificate is trusted");
    host.shutdown().await.unwrap();

    let (pki, _) = pki.other_ca("stranger");
    let err = refused(config(
        &server.url(),
        "tls_ca = \"stranger.pem\"",
        pki.dir.path(),
    ))
    .await;
    assert!(
        err.contains("TLS handshake failed") && err.contains("nats.tls_ca"),
        "{err}"
    );
}

#[tokio::test]
async fn an_expired_server_certificate_is_refused_and_named() {
    let pki = Pki::new("ca");
    pki.issue("old", false, true);
    let server = pki.server("old", false);
    let err = refused(config(&server.url(), "tls_ca = \"ca.pem\"", pki.dir.path())).await;
    assert!(err.contains("TLS handshake failed"), "{err}");
    assert!(err.to_ascii_lowercase().contains("expired"), "{err}");
}

#[tokio::test]
async fn mutual_tls_takes_the_client_certificate_and_refuses_a_host_without_one() {
    let pki = Pki::new("ca");
    pki.issue("server", false, false);
    pki.issue("host", true, false);
    let server = pki.server("server", true);
    let with_cert = "tls_ca = \"ca.pem\"\ntls_cert = \"host.pem\"\ntls_key = \"host-key.pem\"";
    let host = serve::start(config(&server.url(), with_cert, pki.dir.path()))
        .await
        .expect("the client certificate is accepted");
    host.shutdown().await.unwrap();

    let err = refused(config(&server.url(), "tls_ca = \"ca.pem\"", pki.dir.path())).await;
    assert!(err.contains("nats.tls_cert"), "{err}");
}

#[tokio::test]
async fn an_nkey_user_connects_with_its_seed_and_another_seed_is_refused() {
    let user = nkeys::KeyPair::new_user();
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("nkey.conf");
    std::fs::write(
        &conf,
        format!(
            "authorization {{\n  users = [ {{ nkey: \"{}\" }} ]\n}}\n",
            user.public_key()
        ),
    )
    .unwrap();
    let server = NatsServer::start_with(&["-c", &conf.display().to_string()]);
    let seed = format!("nkey_seed = \"{}\"", user.seed().unwrap());
    let host = serve::start(config(&server.url(), &seed, dir.path()))
        .await
        .expect("the nkey user is accepted");
    host.shutdown().await.unwrap();

    let stranger = format!(
        "nkey_seed = \"{}\"",
        nkeys::KeyPair::new_user().seed().unwrap()
    );
    let err = refused(config(&server.url(), &stranger, dir.path())).await;
    assert!(err.contains("refused the credentials"), "{err}");
}

/// A JWT (nats-io/jwt v2) with `claims` (`iss`, `sub`, `iat` and `jti` added), signed by
/// `issuer`.
fn jwt(issuer: &nkeys::KeyPair, subject: &str, mut claims: serde_json::Value) -> String {
    use base64::Engine as _;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    claims["iss"] = issuer.public_key().into();
    claims["sub"] = subject.into();
    claims["iat"] = 1_700_000_000u64.into();
    claims["jti"] = format!("{:032X}", rand_id()).into();
    let head = b64(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let body = b64(claims.to_string().as_bytes());
    let signed = format!("{head}.{body}");
    let signature = issuer.sign(signed.as_bytes()).unwrap();
    format!("{signed}.{}", b64(&signature))
}

fn rand_id() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// A `.creds` file: the user's JWT and seed, as `nsc` writes them.
fn creds(user_jwt: &str, user: &nkeys::KeyPair) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n-----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n",
        user.seed().unwrap()
    )
}

#[tokio::test]
async fn a_creds_file_of_the_accounts_user_connects_and_a_forged_one_is_refused() {
    // Operator mode: an operator, one account with JetStream, its user.
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let user = nkeys::KeyPair::new_user();
    let operator_jwt = jwt(
        &operator,
        &operator.public_key(),
        serde_json::json!({"name": "op", "nats": {"type": "operator", "version": 2}}),
    );
    let unlimited = serde_json::json!({
        "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": true,
        "conn": -1, "leaf": -1, "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1
    });
    let account_jwt = jwt(
        &operator,
        &account.public_key(),
        serde_json::json!({"name": "orders", "nats": {"limits": unlimited, "type": "account", "version": 2}}),
    );
    // Operator mode with JetStream needs a system account.
    let system = nkeys::KeyPair::new_account();
    let system_jwt = jwt(
        &operator,
        &system.public_key(),
        serde_json::json!({"name": "SYS", "nats": {"type": "account", "version": 2}}),
    );
    let user_claims = serde_json::json!({"name": "host", "nats": {
        "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1, "type": "user", "version": 2
    }});
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("operator.conf");
    std::fs::write(
        &conf,
        format!(
            "operator: \"{operator_jwt}\"\nsystem_account: {sys}\nresolver: MEMORY\nresolver_preload: {{\n  {sys}: \"{system_jwt}\"\n  {}: \"{account_jwt}\"\n}}\n",
            account.public_key(),
            sys = system.public_key(),
        ),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("host.creds"),
        creds(
            &jwt(&account, &user.public_key(), user_claims.clone()),
            &user,
        ),
    )
    .unwrap();
    // Signed by an account the operator never issued.
    let forged = jwt(
        &nkeys::KeyPair::new_account(),
        &user.public_key(),
        user_claims,
    );
    std::fs::write(dir.path().join("forged.creds"), creds(&forged, &user)).unwrap();
    let checked = std::process::Command::new("nats-server")
        .args(["-t", "-c"])
        .arg(&conf)
        .output()
        .unwrap();
    assert!(
        checked.status.success(),
        "the operator-mode config: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    let server = NatsServer::start_with(&["-c", &conf.display().to_string()]);

    let host = serve::start(config(
        &server.url(),
        "creds_file = \"host.creds\"",
        dir.path(),
    ))
    .await
    .expect("the account's user is accepted");
    host.shutdown().await.unwrap();
    let err = refused(config(
        &server.url(),
        "creds_file = \"forged.creds\"",
        dir.path(),
    ))
    .await;
    assert!(err.contains("refused the credentials"), "{err}");
}
