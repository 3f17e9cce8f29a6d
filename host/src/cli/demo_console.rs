//! The demo's console part: serves the console of the demo's deployment on a free loopback
//! port and reads its overview back, the way the page's script does.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::config::Config;
use crate::console::auth::Access;

/// How long the overview may take to list the demo's host (hosts publish every 3 s).
const WAIT: Duration = Duration::from_secs(20);

/// Starts the console and waits until its overview lists a host; returns a line to print.
pub async fn check(config: &Config) -> anyhow::Result<String> {
    let addr: SocketAddr = "127.0.0.1:0".parse().expect("an address");
    let access = Access::new(&config.console, |_| None, addr)?;
    let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
    let served = config.clone();
    tokio::spawn(async move {
        let ready = move |bound, _: &Access| {
            let _ = bound_tx.send(bound);
        };
        if let Err(e) = crate::console::serve(served, addr, access, ready).await {
            tracing::warn!("demo console: {e:#}");
        }
    });
    let bound: SocketAddr = bound_rx.await?;
    let started = Instant::now();
    loop {
        let overview = get(bound, "/api/overview").await.unwrap_or_default();
        let json: serde_json::Value = serde_json::from_str(&overview).unwrap_or_default();
        let hosts = json["hosts"].as_array().map_or(0, Vec::len);
        let routes = json["routes"].as_object().map_or(0, |r| r.len());
        if hosts > 0 && routes > 0 {
            let page = get(bound, "/").await.unwrap_or_default();
            return Ok(format!(
                "its overview (a {} byte page) lists {hosts} host(s) and {routes} route(s) with their last 15 minutes; open it on your deployment with `dedup-host console --config FILE`",
                page.len()
            ));
        }
        anyhow::ensure!(
            started.elapsed() < WAIT,
            "the console's overview listed no host within {WAIT:?}: {overview}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One plain HTTP/1.1 GET: the body.
async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).await?;
    let mut text = String::new();
    s.read_to_string(&mut text).await?;
    Ok(text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default())
}
