//! The seeded handler every simulated delivery runs, claim before or after alike: what a key's
//! handler does in a run (fails some attempts, always fails, returns an output over the
//! server's max payload), how long it runs in virtual time, and its outcome as the host's
//! seams take it ([`Handled`]). A replayed key's handler was fixed before the replay.

use std::time::Duration;

use dedup_delivery::before::Handled;
use dedup_delivery::clock::Clock;

use super::ctx::Ctx;
use super::world::{Output, Rng};

/// The size of an output the handler of an oversized key returns (over 1 MiB).
pub(super) const OVERSIZED: usize = 2 << 20;

/// What a key's handler does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    /// Fails its first `n` attempts (`u32::MAX`: all), then succeeds.
    Fails(u32),
    /// Returns an output over the server's max payload, every time.
    Oversized,
}

/// What `key`'s handler does in run `seed` (before any replay).
pub fn handler(seed: u64, key: &str) -> Handler {
    let h = key.bytes().fold(seed ^ 0xfeed, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    match Rng::new(h).bits() % 20 {
        0..=9 => Handler::Fails(0),
        10..=15 => Handler::Fails(1),
        16..=18 => Handler::Fails(u32::MAX),
        _ => Handler::Oversized,
    }
}

impl Ctx {
    /// Runs `key`'s handler for `attempt`: it works for a while of virtual time, then fails
    /// (a retry) or returns its one output.
    pub(super) async fn invoke(&self, key: &str, attempt: u32) -> Result<Handled<Output>, String> {
        self.sleep(Duration::from_millis(self.work_ms(key, attempt)))
            .await;
        let size = match self.handler(key) {
            Handler::Fails(n) if attempt <= n => {
                return Ok(Handled::Retry {
                    reason: "failed".into(),
                    delay: None,
                })
            }
            Handler::Fails(_) => 100,
            Handler::Oversized => OVERSIZED,
        };
        Ok(Handled::Succeeded(Output {
            id: format!("{key}#0"),
            size,
        }))
    }

    /// How long the handler runs on `attempt` of `key`: within two leases claim-before (a
    /// lease lapses unless renewed), within half the ack wait claim-after (no heartbeat).
    fn work_ms(&self, key: &str, attempt: u32) -> u64 {
        let h = key.bytes().fold(self.seed ^ u64::from(attempt), |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let most = match self.settings.mode.claim_after {
            false => self.settings.lease_ms * 2,
            true => self.settings.ack_wait_ms / 2,
        };
        Rng::new(h).bits() % most
    }

    /// What `key`'s handler does now: a replayed key's handler was fixed.
    fn handler(&self, key: &str) -> Handler {
        match self.world().replayed.contains(key) {
            true => Handler::Fails(0),
            false => handler(self.seed, key),
        }
    }
}
