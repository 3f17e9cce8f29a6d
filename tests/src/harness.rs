//! A per-test environment: a nats-server, a temp dir, config text for a host, and helpers to
//! publish, wait and read back streams and claims.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream::Context;
use async_nats::HeaderMap;
use dedup_host::claim::{key, ClaimRecord};
use dedup_host::config::Config;
use dedup_host::serve::{self, RunningHost};
use futures::StreamExt;

use crate::guests::{guest, host_binary};
use crate::nats::{NatsCluster, NatsServer};
use crate::netlab::{Lab, Member};

/// Stream names every test config uses.
pub const SOURCE: &str = "EVENTS";
/// The consumer name.
pub const CONSUMER: &str = "hosts";
/// The claim bucket.
pub const BUCKET: &str = "claims";
/// The output stream.
pub const OUTPUTS: &str = "OUTPUTS";
/// The dead-letter stream.
pub const DEAD: &str = "DEAD";
/// The dead-letter subject.
pub const DEAD_SUBJECT: &str = "dead.letters";

/// A well-behaved route: `uppercase` on `in.upper.*`, outputs on `in.upper.*.done`.
pub const UPPER_ROUTE: &str = r#"
[[routes]]
name = "upper"
subject = "in.upper.*"
component = "{guest:uppercase}"
allowed_outputs = ["in.upper.*.done"]
"#;

/// Timing of a test host: short leases so takeovers happen within seconds.
#[derive(Debug, Clone)]
pub struct Timing {
    /// `claims.lease`.
    pub lease: &'static str,
    /// `claims.heartbeat`.
    pub heartbeat: &'static str,
    /// `source.ack_wait`.
    pub ack_wait: &'static str,
    /// `source.backoff`.
    pub backoff: &'static str,
    /// `source.max_deliver`.
    pub max_deliver: u32,
    /// `source.server_max_deliver`.
    pub server_max_deliver: i64,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            lease: "2s",
            heartbeat: "300ms",
            ack_wait: "2s",
            backoff: r#"["200ms"]"#,
            max_deliver: 5,
            server_max_deliver: dedup_host::config::DEFAULT_SERVER_MAX_DELIVER,
        }
    }
}

/// The in-process hosts' warnings and errors (or what `RUST_LOG` asks for:
/// `RUST_LOG=dedup_host=debug cargo nextest run ...`) go to the test's output, which the test
/// runner shows when the test fails: a failure seen once on a busy CI machine says why.
fn log_to_test_output() {
    let filter = match std::env::var_os("RUST_LOG") {
        Some(_) => tracing_subscriber::EnvFilter::from_default_env(),
        None => tracing_subscriber::EnvFilter::new("dedup_host=warn,dedup_runtime=warn"),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// One test's world.
pub struct TestEnv {
    /// The servers: one, or the nodes of a loopback cluster.
    pub servers: NatsCluster,
    /// Scratch space (config files).
    pub dir: tempfile::TempDir,
    /// A JetStream context for the test's own publishing and reading.
    pub js: Context,
    /// Makes the output stream fenced (`effects = "fenced"`) with a 1 s duplicate window,
    /// so that no window can hide a second output set.
    pub fenced_outputs: bool,
}

impl TestEnv {
    /// Starts a server and connects.
    pub async fn start() -> Self {
        log_to_test_output();
        let server = NatsServer::start();
        let js = async_nats::jetstream::new(server.connect().await);
        Self {
            servers: NatsCluster {
                nodes: vec![server],
            },
            dir: tempfile::tempdir().expect("temp dir"),
            js,
            fenced_outputs: false,
        }
    }

    /// Starts a server from nats-server configuration text (users, permissions: written to
    /// the test's temp dir as `nats-server.conf`; `{dir}` in it stands for that dir) and
    /// connects the test's own client as `user` with `password`, who may read everything the
    /// test checks.
    pub async fn start_with_conf(conf: &str, user: &str, password: &str) -> Self {
        log_to_test_output();
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("nats-server.conf");
        let conf = conf.replace("{dir}", &dir.path().display().to_string());
        std::fs::write(&path, conf).expect("write the server config");
        let server = NatsServer::start_with(&["-c", &path.display().to_string()]);
        let client =
            async_nats::ConnectOptions::with_user_and_password(user.into(), password.into())
                .connect(server.url())
                .await
                .expect("connect to the test nats-server");
        Self {
            servers: NatsCluster {
                nodes: vec![server],
            },
            dir,
            js: async_nats::jetstream::new(client),
            fenced_outputs: false,
        }
    }

    /// Starts a 3-node loopback cluster and connects to all of it. Hosts get every node's
    /// URL, and every stream and bucket they create has 3 replicas on file storage.
    pub async fn start_cluster() -> Self {
        log_to_test_output();
        let servers = NatsCluster::start(3);
        let js = async_nats::jetstream::new(servers.connect().await);
        Self {
            servers,
            dir: tempfile::tempdir().expect("temp dir"),
            js,
            fenced_outputs: false,
        }
    }

    /// Starts a 3-node cluster whose nodes run in three new members of `lab` (see
    /// [`crate::netlab`]), and connects to all of it from the test's own namespace.
    pub async fn start_cluster_in(lab: &mut Lab) -> Self {
        log_to_test_output();
        let places: Vec<Member> = (0..3).map(|_| lab.add()).collect();
        let servers = NatsCluster::start_in(&places);
        let js = async_nats::jetstream::new(servers.connect().await);
        Self {
            servers,
            dir: tempfile::tempdir().expect("temp dir"),
            js,
            fenced_outputs: false,
        }
    }

    /// The first (or only) server.
    pub fn server(&self) -> &NatsServer {
        &self.servers.nodes[0]
    }

    /// Config text for a host with the given timing and `[[routes]]` (TOML text in which
    /// `{guest:NAME}` stands for a built guest's path).
    pub fn config_text(&self, timing: &Timing, routes: &str) -> String {
        let mut routes = routes.to_string();
        while let Some(start) = routes.find("{guest:") {
            let end = start + routes[start..].find('}').expect("`{guest:NAME}` is closed");
            let path = guest(&routes[start + "{guest:".len()..end]);
            routes.replace_range(start..=end, &path.display().to_string());
        }
        let Timing {
            lease,
            heartbeat,
            ack_wait,
            backoff,
            max_deliver,
            server_max_deliver,
        } = timing;
        let replicas = self.servers.nodes.len();
        let storage = if replicas > 1 { "file" } else { "memory" };
        let outputs = if self.fenced_outputs {
            "duplicate_window = \"1s\"\neffects = \"fenced\""
        } else {
            "duplicate_window = \"10m\""
        };
        let components = if replicas > 1 {
            format!("\n[components]\nreplicas = {replicas}\n")
        } else {
            String::new()
        };
        let text = format!(
            r#"
[nats]
urls = {urls:?}

[host]
concurrency = 16
shutdown_grace = "5s"

[source]
stream = "{SOURCE}"
subjects = ["in.*.*"]
consumer = "{CONSUMER}"
ack_wait = "{ack_wait}"
max_deliver = {max_deliver}
server_max_deliver = {server_max_deliver}
backoff = {backoff}
max_ack_pending = 1000
replicas = {replicas}

[claims]
bucket = "{BUCKET}"
lease = "{lease}"
heartbeat = "{heartbeat}"
clock_skew = "200ms"
storage = "{storage}"
replicas = {replicas}

[dead_letter]
subject = "{DEAD_SUBJECT}"
stream = "{DEAD}"
replicas = {replicas}
{components}
[[output_streams]]
name = "{OUTPUTS}"
subjects = ["in.*.*.done", "ledger.entries.>", "out.>"]
{outputs}
replicas = {replicas}

{routes}
"#,
            urls = self.servers.urls()
        );
        crate::schema::agrees_with_the_parser(&text, self.dir.path());
        text
    }

    /// Parses config text (relative paths resolve against the temp dir).
    pub fn config(&self, timing: &Timing, routes: &str) -> Config {
        let text = self.config_text(timing, routes);
        Config::parse(&text, Path::new("test.toml"), self.dir.path().to_path_buf())
            .expect("valid test config")
    }

    /// Starts an in-process host.
    pub async fn host(&self, timing: &Timing, routes: &str, instance_id: &str) -> RunningHost {
        let mut config = self.config(timing, routes);
        config.host.instance_id = Some(instance_id.to_string());
        serve::start(config).await.expect("host starts")
    }

    /// Writes the config to a file and starts `dedup-host run` as a child process; returns once
    /// its consumer exists.
    pub async fn host_process(&self, timing: &Timing, routes: &str, instance_id: &str) -> Child {
        self.host_process_at(None, None, timing, routes, instance_id)
            .await
    }

    /// Like [`TestEnv::host_process`], the host running inside a lab member's namespace when
    /// `place` is given, and connecting to `urls` only when given (every node otherwise).
    pub async fn host_process_at(
        &self,
        place: Option<&Member>,
        urls: Option<&[String]>,
        timing: &Timing,
        routes: &str,
        instance_id: &str,
    ) -> Child {
        let path = self.dir.path().join(format!("{instance_id}.toml"));
        let mut text = self.config_text(timing, routes).replace(
            "[host]\n",
            &format!("[host]\ninstance_id = \"{instance_id}\"\n"),
        );
        if let Some(urls) = urls {
            let all = format!("urls = {:?}", self.servers.urls());
            text = text.replace(&all, &format!("urls = {urls:?}"));
        }
        std::fs::write(&path, text).expect("write config");
        let mut command = match place {
            Some(member) => member.command(host_binary()),
            None => Command::new(host_binary()),
        };
        let child = command
            .args(["run", "--config"])
            .arg(&path)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start dedup-host run");
        // Its routes are compiled first: a cold compile of a 10-20 MB Python or JavaScript
        // component takes a minute on a busy machine.
        wait_for(
            Duration::from_secs(120),
            "the host process's consumer",
            || async {
                let stream = self.js.get_stream(SOURCE).await.ok()?;
                stream
                    .get_consumer::<async_nats::jetstream::consumer::pull::Config>(CONSUMER)
                    .await
                    .ok()
                    .map(|_| ())
            },
        )
        .await;
        child
    }

    /// Publishes with a `Nats-Msg-Id` and extra headers; returns whether it was a duplicate.
    pub async fn publish(
        &self,
        subject: &str,
        msg_id: &str,
        headers: &[(&str, &str)],
        payload: impl Into<bytes::Bytes>,
    ) -> bool {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.insert(*k, *v);
        }
        h.insert("Nats-Msg-Id", msg_id);
        let payload = payload.into();
        // On a cluster a stream may be between leaders for a moment (a node was killed);
        // the message id makes a repeat harmless.
        let started = Instant::now();
        loop {
            let stored = match self
                .js
                .publish_with_headers(subject.to_string(), h.clone(), payload.clone())
                .await
            {
                Ok(ack) => ack.await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match stored {
                Ok(ack) => return ack.duplicate,
                Err(e) if started.elapsed() < Duration::from_secs(20) => {
                    tracing::debug!("publish on `{subject}` not stored yet, retrying: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("publish on `{subject}` not stored: {e}"),
            }
        }
    }

    /// Creates a stream as an operator would, before any host: `name` capturing `subjects`.
    pub async fn create_stream(&self, name: &str, subjects: &[&str]) {
        self.js
            .create_stream(async_nats::jetstream::stream::Config {
                name: name.into(),
                subjects: subjects.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            })
            .await
            .expect("create stream");
    }

    /// Every message in a stream (empty if the stream does not exist yet).
    pub async fn messages(
        &self,
        stream: &str,
    ) -> Vec<async_nats::jetstream::message::StreamMessage> {
        dedup_host::inspect::stream_messages(&self.js, stream)
            .await
            .unwrap_or_default()
    }

    /// The claim record of a route's key.
    pub async fn claim(&self, route: &str, idempotency_key: &str) -> Option<ClaimRecord> {
        if self.fenced_outputs {
            return self
                .fenced_claim(route, idempotency_key)
                .await
                .map(|(r, _)| r);
        }
        let kv = self.js.get_key_value(BUCKET).await.ok()?;
        let entry = kv.get(key::encode(route, idempotency_key)).await.ok()??;
        Some(ClaimRecord::from_bytes(&entry).expect("claim record parses"))
    }

    /// The claim record and revision of a fenced route's key, from the fenced output stream.
    pub async fn fenced_claim(&self, route: &str, key: &str) -> Option<(ClaimRecord, u64)> {
        use dedup_host::claim::ClaimStore as _;
        let subject = dedup_host::fenced::claim_subject(OUTPUTS, &key::encode(route, key));
        dedup_host::claim::stream::StreamClaimStore::new(self.js.clone())
            .get(&subject)
            .await
            .ok()?
    }

    /// The outputs in the output stream (without a fenced stream's claim records).
    pub async fn outputs(&self) -> Vec<async_nats::jetstream::message::StreamMessage> {
        let mut all = self.messages(OUTPUTS).await;
        all.retain(|m| {
            !m.subject
                .starts_with(dedup_host::subject::FENCED_CLAIMS_PREFIX)
        });
        all
    }

    /// Pending and unacknowledged counts, summed over every consumer of the source stream
    /// (one per route, plus the one for unrouted subjects).
    pub async fn pending(&self) -> (u64, usize) {
        let stream = self.js.get_stream(SOURCE).await.expect("source stream");
        let mut infos = stream.consumers();
        let (mut pending, mut unacked) = (0, 0);
        while let Some(info) = infos.next().await {
            let info = info.expect("consumer info");
            pending += info.num_pending;
            unacked += info.num_ack_pending;
        }
        (pending, unacked)
    }

    /// Writes the stranded-message marker of message `sequence` of the source stream, given
    /// up by `consumer` after `deliveries`, as a host writes it before a message's last
    /// delivery (in the claim bucket [`BUCKET`], due at once).
    pub async fn mark_given_up(
        &self,
        consumer: &str,
        sequence: u64,
        deliveries: u64,
    ) -> dedup_host::stranded::Marker {
        use dedup_host::stranded::{self, Marker, Origin};
        let kv = self.js.get_key_value(BUCKET).await.expect("claim bucket");
        let origin = Origin {
            stream: SOURCE,
            sequence,
            consumer,
        };
        let marker = Marker::new(origin, deliveries, "the server's last delivery".into());
        stranded::mark(&kv, &marker).await;
        marker
    }

    /// Waits until the consumers have nothing pending or unacknowledged (for `timeout`, at
    /// least [`LEAST_WAIT`]).
    pub async fn wait_drained(&self, timeout: Duration) {
        let timeout = timeout.max(LEAST_WAIT);
        let started = Instant::now();
        loop {
            if self.pending().await == (0, 0) {
                return;
            }
            assert!(
                started.elapsed() < timeout,
                "consumer not drained after {timeout:?}: {:?}",
                self.pending().await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until every key of `route` is completed, or panics after `within` (at least
    /// [`LEAST_WAIT`]).
    pub async fn wait_completed(&self, route: &str, keys: &[&str], within: Duration) {
        wait_for(
            within,
            &format!("{keys:?} of `{route}` completed"),
            || async {
                for key in keys {
                    let record = self.claim(route, key).await?;
                    if record.state != dedup_host::claim::ClaimState::Completed {
                        return None;
                    }
                }
                Some(())
            },
        )
        .await;
    }

    /// The path of a scratch file.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// The least any wait of a test allows, whatever it asks: a wait is a bound that keeps a
/// broken test from hanging, never a timing, and the suite must pass beside CPU hogs (CI
/// runs it so), where hosts, servers and guests take several times longer than alone.
pub const LEAST_WAIT: Duration = Duration::from_secs(60);

/// Polls `check` until it returns `Some`, or panics after `timeout` (at least
/// [`LEAST_WAIT`]) with `what`.
pub async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let timeout = timeout.max(LEAST_WAIT);
    let started = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            started.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends `sig` (`-STOP`, `-CONT`, `-TERM`, ...) to a host process.
pub fn signal(child: &Child, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {sig} failed");
}

/// Stops a host process gracefully and returns its final counters (the JSON line it prints).
pub fn stop_gracefully(mut child: Child) -> dedup_host::metrics::StatsSnapshot {
    use std::io::Read as _;
    signal(&child, "-TERM");
    let status = child.wait().expect("wait");
    assert!(status.success(), "host exited with {status}");
    let mut out = String::new();
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out)
        .expect("read stdout");
    let line = out.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("final stats not JSON ({e}): {out}"))
}

/// One GET over plain HTTP/1.1 (a host's `/metrics`, `/readyz`): (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n")?.1.to_string();
    Some((status, body))
}

/// Stores a message whose header bytes are not UTF-8, as only a raw `HPUB` can.
pub fn publish_unparseable(port: u16, subject: &str) {
    let mut headers = b"NATS/1.0\r\nNats-Msg-Id: poison\r\nX-Bad: ".to_vec();
    headers.extend_from_slice(&[0xff, 0xfe, 0xfd]);
    headers.extend_from_slice(b"\r\n\r\n");
    publish_raw(port, subject, &headers, b"poison");
}

/// Publishes `payload` on `subject` with the header block `headers` exactly as given (a raw
/// `HPUB` over a plain TCP connection to the server on `port`: no client checks the block),
/// and waits for the server's `PONG`.
pub fn publish_raw(port: u16, subject: &str, headers: &[u8], payload: &[u8]) {
    use std::io::{BufRead, BufReader, Write};
    let stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap(); // INFO
    let mut w = stream;
    w.write_all(b"CONNECT {\"verbose\":false,\"headers\":true,\"protocol\":1}\r\n")
        .unwrap();
    w.write_all(
        format!(
            "HPUB {subject} {} {}\r\n",
            headers.len(),
            headers.len() + payload.len()
        )
        .as_bytes(),
    )
    .unwrap();
    w.write_all(headers).unwrap();
    w.write_all(payload).unwrap();
    w.write_all(b"\r\nPING\r\n").unwrap();
    line.clear();
    reader.read_line(&mut line).unwrap();
    assert!(line.starts_with("PONG"), "{line}");
}
