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

/// One plain HTTP/1.1 request with extra `headers` and a form `body` (empty for a GET):
/// (status, body).
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let (status, _, body) = exchange(addr, method, path, headers, body);
    (status, body)
}

/// Logs in through the login form with `token`: the `Cookie` header value of the new
/// session, or `None` when the console refused.
pub fn login(addr: SocketAddr, token: &str) -> Option<String> {
    let body = format!("token={token}");
    let (status, head, _) = exchange(addr, "POST", "/login", &[], &body);
    if status != 303 {
        return None;
    }
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.eq_ignore_ascii_case("set-cookie"))
        .and_then(|(_, value)| value.trim().split(';').next())
        .map(str::to_string)
}

/// A GET-like request (no body) that names `host` as its `Host`: (status, body).
pub fn request_as(
    addr: SocketAddr,
    host: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let (status, _, body) = send(addr, host, method, path, headers, "");
    (status, body)
}

/// One request: (status, response head, body).
fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    send(addr, &addr.to_string(), method, path, headers, body)
}

fn send(
    addr: SocketAddr,
    host: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the console");
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .expect("timeout");
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if method == "POST" {
        head.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    s.write_all(head.as_bytes()).expect("write");
    s.write_all(body.as_bytes()).expect("write");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (status, head.to_string(), body.to_string())
}
