//! A route making one outbound call per message (issue 45) against the same call made by a
//! hand-written Rust client with the same journal writes ([`super::handhttp`]): the host runs
//! the `http-call` guest, granted HTTP to a local endpoint, and each message's guest POSTs
//! once (the host journals the call PENDING, sends it, journals the answer). Both sides call
//! the same endpoint, which runs in a child process ([`EndpointProcess`]) so that neither its
//! work nor the nats-server's is counted.
//!
//! - `dedup-bench counts http-host|http-hand [N]`: instructions per message under callgrind
//!   (`tests/instructions.sh http-host http-hand`); `counts http-nocall` is the host with the
//!   same guest and route, its messages asking for no call (what the call itself adds);
//! - `dedup-bench http [MESSAGES] [ROUNDS]`: CPU time per message of both, alternating, and
//!   their ratio.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::Instant;

use async_nats::jetstream::{self, Context};
use dedup_host::config::Config;
use dedup_host::serve;

use super::callgrind::dump;
use super::counts::{drain, publishing_alone, WARM_UP};
use super::{handhttp, publish_many, us};
use crate::endpoint::Endpoint;
use crate::guests::guest;
use crate::nats::NatsServer;

/// Messages in flight at once, as in the other host benches.
const CONCURRENCY: usize = 64;

/// The body each call POSTs: a small notification.
const BODY: &str = r#"{"to":"user-1","text":"your order has shipped"}"#;

/// The local endpoint, in a child process (`dedup-bench endpoint`); stopped when dropped.
pub struct EndpointProcess {
    child: Child,
    base: String,
}

impl EndpointProcess {
    /// Starts `dedup-bench endpoint` and reads the address it serves on. Under valgrind the
    /// child runs natively (callgrind traces no children unless told to).
    pub fn start() -> anyhow::Result<Self> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(&exe)
            .arg("endpoint")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting `{} endpoint`: {e}", exe.display()))?;
        let mut line = String::new();
        let stdout = child.stdout.take().expect("piped stdout");
        BufReader::new(stdout).read_line(&mut line)?;
        let Some(base) = line.trim().strip_prefix("endpoint: ") else {
            let _ = child.kill();
            anyhow::bail!(
                "`{} endpoint` printed `{line}`, not its address",
                exe.display()
            );
        };
        Ok(Self {
            base: base.to_string(),
            child,
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base(&self) -> &str {
        &self.base
    }
}

impl Drop for EndpointProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `dedup-bench endpoint`: serves [`Endpoint`], prints `endpoint: <base>`, and stops when
/// its standard input closes (its parent ended).
pub async fn serve_endpoint() -> anyhow::Result<()> {
    let endpoint = Endpoint::start().await;
    println!("endpoint: {}", endpoint.base());
    tokio::task::spawn_blocking(|| std::io::copy(&mut std::io::stdin(), &mut std::io::sink()))
        .await??;
    Ok(())
}

/// The payload of every message: one POST of [`BODY`] to the endpoint at `base`.
fn payload(base: &str) -> Vec<u8> {
    let url = format!("{base}/hooks/bench");
    serde_json::to_vec(&serde_json::json!({ "calls": [{ "url": url, "body": BODY }] }))
        .expect("a payload serializes")
}

/// A payload as long as [`payload`]'s that asks for no call (`http-nocall`): the same guest
/// parses it and publishes an empty result list.
fn no_call(base: &str) -> Vec<u8> {
    let call = payload(base);
    let mut text = br#"{"calls":[],"pad":""}"#.to_vec();
    let pad = call.len().saturating_sub(text.len());
    text.splice(
        text.len() - 2..text.len() - 2,
        std::iter::repeat_n(b'x', pad),
    );
    text
}

/// A host on `server` whose route `bench` runs `http-call` on `g<name>.in.*`, granted POSTs
/// to the endpoint at `base`.
fn host_config(server: &NatsServer, name: &str, base: &str) -> anyhow::Result<Config> {
    let routes = format!(
        "[[routes]]\nname = \"bench\"\nsubject = \"g{name}.in.*\"\ncomponent = \"{}\"\nallowed_outputs = [\"g{name}.in.*.done\"]\n[routes.http]\nallow = [\"{base}/hooks/*\"]\n",
        guest("http-call").display()
    );
    super::bench_config(
        server,
        name,
        &format!("g{name}.in.*"),
        &format!("g{name}.in.*.done"),
        &format!("concurrency = {CONCURRENCY}"),
        &routes,
    )
}

/// Checks that the last output on `subject` holds a call answered 201: the guest's calls
/// went through (it reports a refused or failed call in its output, and still succeeds).
async fn check_output(js: &Context, stream: &str, subject: &str) -> anyhow::Result<()> {
    let stream = js.get_stream(stream).await?;
    let last = stream.get_last_raw_message_by_subject(subject).await?;
    let text = String::from_utf8_lossy(&last.payload);
    anyhow::ensure!(
        text.contains("\"status\":201"),
        "the call was not answered 201: the output is {text}"
    );
    Ok(())
}

/// `counts http-host`: `n` messages through an in-process host, each making one call; with
/// `call` false (`counts http-nocall`), the same route whose messages ask for no call.
pub(super) async fn counts_host(n: usize, call: bool) -> anyhow::Result<()> {
    let endpoint = EndpointProcess::start()?;
    let payload = match call {
        true => payload(endpoint.base()),
        false => no_call(endpoint.base()),
    };
    let server = NatsServer::start();
    let js = jetstream::new(server.connect().await);
    publishing_alone(&js, n, &payload).await?;
    let name = "http";
    let running = serve::start(host_config(&server, name, endpoint.base())?).await?;
    let processed = || running.stats().processed;
    let warm = WARM_UP as u64;
    let (warm_subject, x_subject) = (format!("g{name}.in.warm"), format!("g{name}.in.x"));
    drain(
        &js,
        (&warm_subject, "warm"),
        WARM_UP,
        &payload,
        warm,
        processed,
    )
    .await?;
    dump("warm");
    let target = warm + n as u64;
    drain(&js, (&x_subject, "x"), n, &payload, target, processed).await?;
    dump("work");
    running.shutdown().await?;
    let (stream, subject) = (format!("OUT_{name}"), format!("g{name}.in.x.done"));
    match call {
        true => check_output(&js, &stream, &subject).await,
        false => Ok(()),
    }
}

/// `counts http-hand`: `n` messages through the hand-written caller.
pub(super) async fn counts_hand(n: usize) -> anyhow::Result<()> {
    let endpoint = EndpointProcess::start()?;
    let payload = payload(endpoint.base());
    let server = NatsServer::start();
    let js = jetstream::new(server.connect().await);
    publishing_alone(&js, n, &payload).await?;
    let (worker, settled) = handhttp::start(&js, "hand").await?;
    let count = || settled.load(Ordering::Relaxed);
    let warm = WARM_UP as u64;
    drain(&js, ("hand.warm", "warm"), WARM_UP, &payload, warm, count).await?;
    dump("warm");
    drain(&js, ("hand.x", "x"), n, &payload, warm + n as u64, count).await?;
    dump("work");
    worker.abort();
    check_output(&js, "HANDOUT_hand", "outhand.done").await
}

/// What one side measured in one round.
struct Round {
    /// CPU time of this process per message, less the publishing's.
    cpu: std::time::Duration,
    /// Messages per second, publishing included.
    rate: f64,
}

/// Which side a round runs.
#[derive(Clone, Copy)]
enum Side {
    Host,
    Hand,
}

/// One round of `side`: a warm-up, then `n` messages published and drained, timed; the
/// CPU of publishing `n` alone (measured first, on a stream nobody consumes) is taken out.
async fn round(
    server: &NatsServer,
    js: &Context,
    endpoint: &EndpointProcess,
    side: Side,
    r: usize,
    n: usize,
) -> anyhow::Result<Round> {
    let payload = payload(endpoint.base());
    let idle = format!("pubonly{r}");
    super::pull_consumer(js, &format!("PUBONLY{r}"), &format!("{idle}.>"), "idle").await?;
    publish_many(
        js,
        &format!("{idle}.warm"),
        &format!("{idle}w"),
        WARM_UP,
        &payload,
    )
    .await?;
    let cpu = super::process_cpu();
    publish_many(js, &format!("{idle}.x"), &idle, n, &payload).await?;
    let publishing = super::process_cpu() - cpu;
    let warm = WARM_UP as u64;
    let (started, cpu) = match side {
        Side::Host => {
            let name = format!("http{r}");
            let running = serve::start(host_config(server, &name, endpoint.base())?).await?;
            let done = || running.stats().processed;
            publish_many(js, &format!("g{name}.in.warm"), "warm", WARM_UP, &payload).await?;
            poll(&done, warm).await;
            let (started, cpu) = (Instant::now(), super::process_cpu());
            publish_many(js, &format!("g{name}.in.x"), "x", n, &payload).await?;
            poll(&done, warm + n as u64).await;
            let measured = (started, super::process_cpu() - cpu);
            running.shutdown().await?;
            measured
        }
        Side::Hand => {
            let name = format!("hand{r}");
            let (worker, settled) = handhttp::start(js, &name).await?;
            let done = || settled.load(Ordering::Relaxed);
            publish_many(js, &format!("{name}.warm"), "warm", WARM_UP, &payload).await?;
            poll(&done, warm).await;
            let (started, cpu) = (Instant::now(), super::process_cpu());
            publish_many(js, &format!("{name}.x"), "x", n, &payload).await?;
            poll(&done, warm + n as u64).await;
            let measured = (started, super::process_cpu() - cpu);
            worker.abort();
            measured
        }
    };
    Ok(Round {
        rate: n as f64 / started.elapsed().as_secs_f64(),
        cpu: cpu.saturating_sub(publishing) / n as u32,
    })
}

/// Waits until `done()` reaches `target`, polling every millisecond.
async fn poll(done: &impl Fn() -> u64, target: u64) {
    while done() < target {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

/// `dedup-bench http [MESSAGES] [ROUNDS]`: `rounds` rounds of the host and the hand-written
/// caller, alternating, `messages` each, on one nats-server and one endpoint; prints each
/// round's CPU per message and rate, and the ratio of the medians.
pub async fn run(messages: usize, rounds: usize) -> anyhow::Result<()> {
    let endpoint = EndpointProcess::start()?;
    let server = NatsServer::start();
    let js = jetstream::new(server.connect().await);
    let (mut host, mut hand) = (Vec::new(), Vec::new());
    let mut r = 0;
    for _ in 0..rounds {
        for side in [Side::Host, Side::Hand] {
            let got = round(&server, &js, &endpoint, side, r, messages).await?;
            r += 1;
            let label = match side {
                Side::Host => "host (http-call guest)",
                Side::Hand => "hand-written (hyper)",
            };
            println!(
                "  {label:<24} cpu {:>7} us/msg   {:>7.0} msg/s",
                us(got.cpu),
                got.rate
            );
            match side {
                Side::Host => host.push(got),
                Side::Hand => hand.push(got),
            }
        }
    }
    let median = |rounds: &mut Vec<Round>| {
        rounds.sort_by_key(|r| r.cpu);
        rounds[rounds.len() / 2].cpu
    };
    let (host_cpu, hand_cpu) = (median(&mut host), median(&mut hand));
    println!(
        "one outbound call per message ({messages} messages x {rounds} rounds, {CONCURRENCY} in flight): median cpu host {} us/msg, hand-written {} us/msg, ratio {:.2}",
        us(host_cpu),
        us(hand_cpu),
        host_cpu.as_secs_f64() / hand_cpu.as_secs_f64()
    );
    Ok(())
}
