//! Test guest that misbehaves on request: the payload names the misbehaviour.
//!
//! Used by the host's tests to check that a guest cannot crash, stall or escape the host.
//! `sleep:<ms>` sleeps, then reports its fencing token. Any other payload is echoed back on
//! `<subject>.done`.

wit_bindgen::generate!({
    path: "../../../wit",
    world: "handler-guest",
});

use dedup::handler::log::{log, Level};
use dedup::handler::types::{Event, Failure, Output};
use exports::dedup::handler::handler::Guest;

struct Hostile;

fn output(subject: String, payload: Vec<u8>) -> Output {
    Output { subject, payload, headers: Vec::new() }
}

#[allow(unconditional_recursion)]
fn recurse(depth: u64, pad: [u8; 64]) -> u64 {
    std::hint::black_box(pad);
    recurse(depth + 1, pad) + 1
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
