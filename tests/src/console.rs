//! `dedup-host console` as a child process, on a free loopback port (the console's tests and
//! its benchmark); killed when dropped.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::guests::host_binary;

/// A running console.
pub struct ConsoleProcess {
    /// The process.
    pub child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl ConsoleProcess {
    /// Starts `dedup-host console --config CONFIG --addr 127.0.0.1:0`, with `token` as
    /// DEDUP_CONSOLE_TOKEN when given, and reads the address it prints.
    pub fn start(config: &Path, token: Option<&str>) -> Self {
        let mut command = Command::new(host_binary());
        command
            .args(["console", "--addr", "127.0.0.1:0", "--config"])
            .arg(config)
            .env_remove("DEDUP_CONSOLE_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(token) = token {
            command.env("DEDUP_CONSOLE_TOKEN", token);
        }
        let mut child = command.spawn().expect("start dedup-host console");
        let stderr = child.stderr.take().expect("stderr");
        let (found, addr) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("console: {line}");
                match line.strip_prefix("console: http://") {
                    Some(rest) if !sent => {
                        let addr = rest.split('/').next().unwrap_or_default().to_string();
                        let _ = found.send(addr);
                        sent = true;
                    }
                    _ => {}
                }
            }
        });
        let addr = addr
            .recv_timeout(Duration::from_secs(30))
            .expect("the console prints its address");
        Self {
            child,
            addr: addr.parse().expect("an address"),
        }
    }
}

impl Drop for ConsoleProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
