//! The console's own cost (issue 28): the full pipeline (`uppercase`, claim before) drained by
//! a host with no console, and with `dedup-host console` running on the same deployment and
//! an overview open on it (the page loaded, then `/api/overview` read every 3 s, as the
//! page's script does), in rounds on one nats-server, which of the two goes first alternating. Reports throughput and host
//! CPU per message, each the median of the rounds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;

use super::pipeline::{guarded_config, guarded_config_text, guarded_run, Effects};
use super::tracing::medians;
use super::us;
use crate::console::ConsoleProcess;
use crate::harness::http_get;
use crate::nats::NatsServer;

/// The CPU time process `pid` has used (user and system, from `/proc/<pid>/stat`).
fn process_cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command's closing parenthesis, field 3 (state) comes first: utime (field 14)
    // and stime (15) are the 12th and 13th, in USER_HZ ticks (100 a second on Linux).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// What an open overview does until `stop`: loads the page, then reads `/api/overview` every
/// 3 s. Returns the pages read.
fn view(addr: std::net::SocketAddr, stop: &AtomicBool) -> usize {
    let mut read = usize::from(http_get(addr, "/").is_some());
    while !stop.load(Ordering::Relaxed) {
        read += usize::from(http_get(addr, "/api/overview").is_some());
        for _ in 0..30 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    read
}

/// Runs `rounds` rounds of `messages` each without a console, then with one open.
pub async fn run(messages: usize, rounds: usize) -> anyhow::Result<()> {
    let server = NatsServer::start();
    let js = jetstream::new(server.connect().await);
    let dir = tempfile::tempdir()?;
    let (mut off, mut on) = (Vec::new(), Vec::new());
    let mut pages = 0;
    let mut console_cpu = Duration::ZERO;
    for round in 0..rounds {
        // Which goes first alternates, so a server that slows as it fills favours neither.
        for watched in [round % 2 == 1, round % 2 == 0] {
            if !watched {
                let name = format!("plain{round}");
                let config = guarded_config(&server, &name, Some(Effects::Window))?;
                off.push(guarded_run(config, &js, &name, messages, 1, true).await?);
                continue;
            }
            let name = format!("watched{round}");
            let path = dir.path().join(format!("{name}.toml"));
            std::fs::write(&path, guarded_config_text(&server, &name))?;
            let console = ConsoleProcess::start(&path, None);
            let stop = Arc::new(AtomicBool::new(false));
            let viewer = std::thread::spawn({
                let (stop, addr) = (stop.clone(), console.addr);
                move || view(addr, &stop)
            });
            let config = guarded_config(&server, &name, Some(Effects::Window))?;
            on.push(guarded_run(config, &js, &name, messages, 1, true).await?);
            stop.store(true, Ordering::Relaxed);
            pages += viewer.join().expect("viewer thread");
            console_cpu += process_cpu(console.child.id());
            drop(console);
        }
    }
    let (rate_off, cpu_off) = medians(&off);
    let (rate_on, cpu_on) = medians(&on);
    println!("no console vs a console open on the overview ({messages} messages, {rounds} alternating rounds, medians; {pages} pages read):");
    println!(
        "  no console                  {rate_off:>9.0} msg/s   cpu {:>6} us/msg",
        us(cpu_off)
    );
    println!(
        "  console open                {rate_on:>9.0} msg/s   cpu {:>6} us/msg",
        us(cpu_on)
    );
    println!(
        "  the console process itself  {} us of CPU per message handled ({:.2} s in all)",
        us(console_cpu / (rounds * messages) as u32),
        console_cpu.as_secs_f64()
    );
    println!("  throughput ratio open/none  {:.2}", rate_on / rate_off);
    println!(
        "  cpu ratio open/none         {:.2}",
        cpu_on.as_secs_f64() / cpu_off.as_secs_f64()
    );
    Ok(())
}
