//! The cost of traces (issue 29): the full pipeline (`uppercase`, claim before) with traces
//! off, and with traces on and the OTLP exporter pointed at a dead endpoint (every export
//! fails; spans are dropped and counted), in alternating rounds on one nats-server, so the
//! ratio compares like with like. Reports throughput and host CPU per message (the steadier
//! figure on shared cores), each the median of the rounds.

use std::time::Duration;

use async_nats::jetstream;
use dedup_host::config::telemetry::{OtlpProtocol, TracesExporter};

use super::pipeline::{guarded_config, guarded_run, Effects, Figures};
use super::us;
use crate::nats::NatsServer;

/// Runs `rounds` rounds of `messages` each with traces off, then on against a dead endpoint.
pub async fn run(messages: usize, rounds: usize) -> anyhow::Result<()> {
    let server = NatsServer::start();
    let js = jetstream::new(server.connect().await);
    let dead = std::net::TcpListener::bind("127.0.0.1:0")?;
    let endpoint = format!("http://{}", dead.local_addr()?);
    drop(dead);
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let name = format!("off{round}");
        let config = guarded_config(&server, &name, Some(Effects::Window))?;
        off.push(guarded_run(config, &js, &name, messages, 1, true).await?);
        let name = format!("dead{round}");
        let mut config = guarded_config(&server, &name, Some(Effects::Window))?;
        config.telemetry.traces = Some(TracesExporter::Otlp);
        config.telemetry.protocol = Some(OtlpProtocol::HttpProtobuf);
        config.telemetry.endpoint = Some(endpoint.clone());
        on.push(guarded_run(config, &js, &name, messages, 1, true).await?);
    }
    let (rate_off, cpu_off) = medians(&off);
    let (rate_on, cpu_on) = medians(&on);
    println!("traces off vs on with a dead OTLP endpoint ({messages} messages, {rounds} alternating rounds, medians):");
    println!(
        "  traces off                  {rate_off:>9.0} msg/s   cpu {:>6} us/msg",
        us(cpu_off)
    );
    println!(
        "  traces on, dead endpoint    {rate_on:>9.0} msg/s   cpu {:>6} us/msg",
        us(cpu_on)
    );
    println!("  throughput ratio on/off     {:.2}", rate_on / rate_off);
    println!(
        "  cpu ratio on/off            {:.2}",
        cpu_on.as_secs_f64() / cpu_off.as_secs_f64()
    );
    Ok(())
}

/// The median throughput and CPU per message of `runs`.
pub(super) fn medians(runs: &[Figures]) -> (f64, Duration) {
    let mut rates: Vec<f64> = runs.iter().map(|f| f.rate).collect();
    rates.sort_by(f64::total_cmp);
    let mut cpus: Vec<Duration> = runs.iter().filter_map(|f| f.cpu_per_message).collect();
    cpus.sort();
    (rates[rates.len() / 2], cpus[cpus.len() / 2])
}
