//! Test guest that misbehaves on request: the payload names the misbehaviour.
//!
//! Used by the host's tests to check that a guest cannot crash, stall or escape the host.
//! `sleep:<ms>` sleeps, then reports its fencing token; `read:<path>` returns a file's
//! contents; `trap-midway` logs and outputs, then hits `unreachable`; `emit:<outputs>` returns
//! exactly the outputs described (records split by 0x1E, fields by 0x1F: subject, then header
//! name and value pairs); `reject:<n>` rejects with an `n`-byte reason; `retry:<ms>` asks for
//! a retry after `ms`; `sleep-reject:<ms>` sleeps, then rejects; `spin-sleep:<a>:<b>` computes for `a` ms, then sleeps `b` ms; `probe:<ms>[:<n>]` retries until attempt `n`, then
//! sleeps and reports its wall-clock start and end; `remember` reports what an earlier
//! invocation could have left behind (a static counter and 4 MiB of zero-initialised memory),
//! then dirties both. Any other payload is echoed back on `<subject>.done`.

wit_bindgen::generate!({
    path: "../../../wit",
    world: "handler-guest",
});

use dedup::handler::log::{log, Level};
use dedup::handler::types::{Event, Failure, Header, Output, RetryRequest};
use exports::dedup::handler::handler::Guest;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};

struct Hostile;

/// Bumped by every `remember`: a fresh instance always starts it at 0.
static REMEMBERED: AtomicU32 = AtomicU32::new(0);
/// 4 MiB of zero-initialised memory, one byte per page marked by every `remember`.
static SCRATCH: [AtomicU8; 4 << 20] = [const { AtomicU8::new(0) }; 4 << 20];

fn output(subject: String, payload: Vec<u8>) -> Output {
    Output { subject, payload, headers: Vec::new() }
}

#[allow(unconditional_recursion)]
fn recurse(depth: u64, pad: [u8; 64]) -> u64 {
    std::hint::black_box(pad);
    recurse(depth + 1, pad) + 1
}

/// Opens a TCP socket to 127.0.0.1:4222 through WASI sockets directly (not through libc).
fn connect() -> Result<(), String> {
    use wasi::sockets::network::{IpAddressFamily, IpSocketAddress, Ipv4SocketAddress};
    let socket = wasi::sockets::tcp_create_socket::create_tcp_socket(IpAddressFamily::Ipv4)
        .map_err(|e| format!("create: {e:?}"))?;
    let network = wasi::sockets::instance_network::instance_network();
    let address = IpSocketAddress::Ipv4(Ipv4SocketAddress { port: 4222, address: (127, 0, 0, 1) });
    socket.start_connect(&network, address).map_err(|e| format!("connect: {e:?}"))?;
    socket.subscribe().block();
    socket.finish_connect().map(|_| ()).map_err(|e| format!("connect: {e:?}"))
}

impl Guest for Hostile {
    fn handle(event: Event) -> Result<Vec<Output>, Failure> {
        let done = format!("{}.done", event.subject);
        match std::str::from_utf8(&event.payload).unwrap_or("") {
            "panic" => panic!("guest panicked on purpose"),
            "loop" => loop {
                std::hint::black_box(event.attempt);
            },
            "alloc" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            "remember" => {
                let before = REMEMBERED.fetch_add(1, Ordering::Relaxed);
                let pages = SCRATCH.iter().step_by(4096);
                let dirty = pages.clone().filter(|b| b.load(Ordering::Relaxed) != 0).count();
                pages.for_each(|b| b.store(0xAA, Ordering::Relaxed));
                Ok(vec![output(done, format!("counter={before} dirty={dirty}").into_bytes())])
            }
            "recurse" => Ok(vec![output(done, recurse(0, [7; 64]).to_string().into_bytes())]),
            "big-output" => Ok(vec![output(done, vec![b'x'; 64 << 20])]),
            "many-outputs" => Ok((0..100_000).map(|i| output(done.clone(), i.to_string().into_bytes())).collect()),
            "forbidden" => Ok(vec![output("forbidden.subject".into(), b"sneaky".to_vec())]),
            "log-flood" => {
                for i in 0..1_000_000 {
                    log(Level::Info, "flood", &[("i".into(), i.to_string())]);
                }
                Ok(Vec::new())
            }
            "env" => {
                let vars: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
                let args: Vec<String> = std::env::args().collect();
                Ok(vec![output(done, format!("env={vars:?} args={args:?}").into_bytes())])
            }
            "file" => match std::fs::read_to_string("/etc/passwd") {
                Ok(s) => Ok(vec![output(done, s.into_bytes())]),
                Err(e) => Err(Failure::Reject(format!("file: {e}"))),
            },
            "socket" => match connect() {
                Ok(()) => Ok(vec![output(done, b"connected".to_vec())]),
                Err(e) => Err(Failure::Reject(format!("socket: {e}"))),
            },
            "trap-midway" => {
                log(Level::Info, "halfway there", &[]);
                let partial = vec![output(done, b"partial".to_vec())];
                std::hint::black_box(&partial);
                core::arch::wasm32::unreachable()
            }
            s if s.starts_with("emit:") => Ok(s["emit:".len()..]
                .split('\u{1e}')
                .map(|record| {
                    let mut fields = record.split('\u{1f}');
                    let subject = fields.next().unwrap_or("").to_string();
                    let mut headers = Vec::new();
                    while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
                        headers.push(Header { name: name.into(), value: value.into() });
                    }
                    Output { subject, payload: b"emitted".to_vec(), headers }
                })
                .collect()),
            s if s.starts_with("reject:") => {
                let n: usize = s["reject:".len()..].parse().unwrap_or(0);
                Err(Failure::Reject("r\n".repeat(n / 2)))
            }
            s if s.starts_with("sleep-reject:") => {
                let ms: u64 = s["sleep-reject:".len()..].parse().unwrap_or(0);
                std::thread::sleep(std::time::Duration::from_millis(ms));
                Err(Failure::Reject("rejected after sleeping".into()))
            }
            s if s.starts_with("retry:") => Err(Failure::Retry(RetryRequest {
                reason: "asked to retry".into(),
                delay_ms: s["retry:".len()..].parse().ok(),
            })),
            s if s.starts_with("spin-sleep:") => {
                let mut parts = s["spin-sleep:".len()..].split(':').map(|p| p.parse::<u64>().unwrap_or(0));
                let (spin, sleep) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
                let started = std::time::Instant::now();
                while started.elapsed() < std::time::Duration::from_millis(spin) {
                    std::hint::black_box(event.attempt);
                }
                std::thread::sleep(std::time::Duration::from_millis(sleep));
                Ok(Vec::new())
            }
            s if s.starts_with("read:") => match std::fs::read_to_string(&s["read:".len()..]) {
                Ok(text) => Ok(vec![output(done, text.into_bytes())]),
                Err(e) => Err(Failure::Reject(format!("read: {e}"))),
            },
            s if s.starts_with("probe:") => {
                // probe:<ms>[:<n>]: asks for a retry until attempt n, then sleeps ms and
                // reports when it ran (wall clock, µs), for tests of one-at-a-time execution.
                let mut parts = s["probe:".len()..].split(':').map(|p| p.parse::<u64>().unwrap_or(0));
                let (ms, until) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
                if u64::from(event.attempt) < until {
                    return Err(Failure::Retry(RetryRequest { reason: "probe: not yet".into(), delay_ms: Some(10) }));
                }
                let now = || {
                    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros())
                };
                let start = now();
                std::thread::sleep(std::time::Duration::from_millis(ms));
                let end = now();
                let report = format!(
                    "{{\"subject\":\"{}\",\"sequence\":{},\"key\":\"{}\",\"attempt\":{},\"start\":{start},\"end\":{end}}}",
                    event.subject, event.stream_sequence, event.key, event.attempt
                );
                Ok(vec![output(done, report.into_bytes())])
            }
            s if s.starts_with("sleep:") => {
                let ms: u64 = s["sleep:".len()..].parse().unwrap_or(0);
                std::thread::sleep(std::time::Duration::from_millis(ms));
                let note = format!("slept {ms} ms under fencing token {}", event.fencing_token);
                Ok(vec![output(done, note.into_bytes())])
            }
            _ => Ok(vec![output(done, event.payload)]),
        }
    }
}

export!(Hostile);
