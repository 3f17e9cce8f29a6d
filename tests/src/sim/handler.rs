//! The seeded handler every simulated delivery runs, claim before or after alike: what a key's
//! handler does in a run (fails some attempts, always fails, returns an output over the
//! server's max payload), how long it runs in virtual time, the outputs it returns (none to
//! three, to one subject or two, some with many headers) and the trace context its event
//! carries, all drawn per key from the seed; and its outcome as the host's seams take it
//! ([`Handled`]). A replayed key's handler was fixed before the replay.

use std::time::Duration;

use dedup_delivery::before::Handled;
use dedup_delivery::clock::Clock;
use dedup_host::bindings::{Header, Output};

use super::ctx::Ctx;
use super::outputs::{Outputs, BLOCK_FRAMING, LINE_FRAMING};
use super::world::{Rng, Version};

/// The size of an output the handler of an oversized key returns (over 1 MiB).
pub(super) const OVERSIZED: usize = 2 << 20;

/// What a key's handler does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    /// Fails its first `n` attempts (`u32::MAX`: all), then returns its outputs (the second
    /// field: how many, 0 to 3).
    Fails(u32, usize),
    /// Returns its outputs (1 to 3), one of them over the server's max payload as published
    /// (far over, or just over: by less than its header block's framing), every time.
    Oversized(usize),
}

impl Handler {
    /// How many outputs it returns when it succeeds (a replayed key's fixed handler too).
    pub fn outputs(self) -> usize {
        match self {
            Handler::Fails(_, n) | Handler::Oversized(n) => n,
        }
    }
}

/// A hash of `key` under `seed`.
fn hash(seed: u64, key: &str) -> u64 {
    key.bytes().fold(seed, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What `key`'s handler does in run `seed` (before any replay).
pub fn handler(seed: u64, key: &str) -> Handler {
    let outputs = match Rng::new(hash(seed ^ 0x07b5, key)).bits() % 8 {
        0 => 0,
        1..=4 => 1,
        5 | 6 => 2,
        _ => 3,
    };
    match Rng::new(hash(seed ^ 0xfeed, key)).bits() % 20 {
        0..=9 => Handler::Fails(0, outputs),
        10..=15 => Handler::Fails(1, outputs),
        16..=18 => Handler::Fails(u32::MAX, outputs),
        _ => Handler::Oversized(outputs.max(1)),
    }
}

/// The trace context a producer set on `key`'s messages (its retries carry the same): none,
/// a `traceparent`, or one with a `tracestate` of up to 2 KiB (the host carries both as they
/// came, whatever their size).
fn trace_context(rng: &mut Rng) -> Vec<(&'static str, String)> {
    let parent = format!("00-{:032x}-{:016x}-01", rng.bits(), rng.bits());
    match rng.bits() % 4 {
        0 => Vec::new(),
        1 => vec![("traceparent", parent)],
        _ => {
            let state = format!("v={}", "s".repeat(rng.range(1, 2048) as usize));
            vec![("traceparent", parent), ("tracestate", state)]
        }
    }
}

impl Ctx {
    /// Runs version `version` of `key`'s handler for `attempt`: it works for a while of
    /// virtual time, then fails (a retry) or returns its outputs, made by that version. A
    /// host running a shadow candidate runs it beside a run of the live version
    /// ([`Ctx::shadow`]).
    pub(super) async fn invoke(
        &self,
        key: &str,
        attempt: u32,
        version: &str,
    ) -> Result<Handled<Outputs>, String> {
        self.world().runs(&self.route, key);
        self.sleep(Duration::from_millis(self.work_ms(key, attempt)))
            .await;
        let handler = self.handler(key);
        if let Handler::Fails(n, _) = handler {
            if attempt <= n {
                return Ok(Handled::Retry {
                    reason: "failed".into(),
                    delay: None,
                });
            }
        }
        self.shadow(key, handler, version);
        Ok(Handled::Succeeded(self.outputs(
            key,
            handler,
            Version::of(version),
        )))
    }

    /// The outputs `key`'s `handler` returns, drawn from the seed: the same on every run of
    /// the key (a replayed key's fixed handler returns the same, none oversized). An
    /// oversized key's output `i` is far over the server's max payload, or just over it as a
    /// window route publishes it (its header block with the host's id and the event's trace
    /// context, plus its payload; a fenced batch member is larger still) while its names,
    /// values and payload alone are under it: what a count without the wire framing misses.
    pub(super) fn outputs(&self, key: &str, handler: Handler, version: Version) -> Outputs {
        let mut rng = Rng::new(hash(self.seed ^ 0x5e7d, key));
        let trace = trace_context(&mut rng);
        let list = (0..handler.outputs())
            .map(|_| {
                let subject = ["out.a", "out.b"][rng.range(0, 1) as usize];
                let headers = match rng.chance(125) {
                    true => rng.range(20, 150),
                    false => rng.range(0, 3),
                };
                let headers = (0..headers)
                    .map(|j| Header {
                        name: format!("X-H{j}"),
                        value: "v".repeat(rng.range(0, 40) as usize),
                    })
                    .collect();
                Output {
                    subject: subject.into(),
                    payload: vec![b'p'; rng.range(0, 200) as usize],
                    headers,
                }
            })
            .collect();
        let mut outputs = Outputs {
            list,
            trace,
            version,
        };
        if let Handler::Oversized(n) = handler {
            let over = rng.range(0, n as u64 - 1) as usize;
            let size = match rng.chance(500) {
                true => OVERSIZED,
                false => {
                    outputs.list[over].payload.clear();
                    let (block, lines) = outputs.blocks(key)[over];
                    let framing = BLOCK_FRAMING + LINE_FRAMING * lines;
                    let max = self.world().max_payload;
                    max - block + rng.range(1, framing as u64) as usize
                }
            };
            outputs.list[over].payload = vec![b'p'; size];
        }
        outputs
    }

    /// How long the handler runs on `attempt` of `key`: within two leases claim-before (a
    /// lease lapses unless renewed), within half the ack wait claim-after (no heartbeat).
    fn work_ms(&self, key: &str, attempt: u32) -> u64 {
        let h = hash(self.seed ^ u64::from(attempt), key);
        let most = match self.settings.mode.claim_after {
            false => self.settings.lease_ms * 2,
            true => self.settings.ack_wait_ms / 2,
        };
        Rng::new(h).bits() % most
    }

    /// What `key`'s handler does now: a replayed key's handler was fixed.
    fn handler(&self, key: &str) -> Handler {
        let drawn = handler(self.seed, key);
        match self.world().replayed.contains(key) {
            true => Handler::Fails(0, drawn.outputs()),
            false => drawn,
        }
    }
}
