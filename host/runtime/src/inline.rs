//! Whether a route's next guest call may start on the thread that asks for it.
//!
//! A guest call handed to the guest threads costs two thread wake-ups (there and back),
//! about a quarter of a no-op guard's CPU per message. A call whose route's guests have been
//! short starts on the caller's thread instead: most finish before the first epoch tick
//! ([`super::engine::EPOCH_TICK`]) and never leave it; one that yields (at that tick, in a
//! host call, or waiting for a guest slot) goes on on the guest threads from there. A route
//! whose call used [`LONG_SLICE`] of CPU time or more in its first slice starts its calls on the guest
//! threads for [`COOL_DOWN`]: a looping or heavy guest holds an I/O thread
//! for about a tick per cool-down, however its keys alternate. (A short call that a tick
//! happens to interrupt moves without closing the gate: ticks come every millisecond while
//! any guest runs, so one hits a 20 µs call now and then.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long a route's calls start on the guest threads after one ran long.
pub const COOL_DOWN: Duration = Duration::from_secs(10);

/// A first slice that uses this much CPU time closes the gate (half a tick: a loop that a
/// tick interrupts sooner moves without closing it, and closes it at the next call or two).
pub const LONG_SLICE: Duration = Duration::from_micros(500);

/// One route's record of how long its guests run (see the module's doc).
#[derive(Debug, Default)]
pub struct InlineGate {
    /// Milliseconds after [`base`] before which calls start on the guest threads.
    off_until: AtomicU64,
}

impl InlineGate {
    /// Whether the next call may start on the caller's thread.
    pub fn allows(&self) -> bool {
        now_ms() >= self.off_until.load(Ordering::Relaxed)
    }

    /// Records a first slice run on the caller's thread that used `slice` of its CPU time
    /// (the whole call, or up to where it yielded and moved to the guest threads).
    pub fn ran(&self, slice: Duration) {
        if slice >= LONG_SLICE {
            self.close();
        }
    }

    fn close(&self) {
        let until = now_ms() + COOL_DOWN.as_millis() as u64;
        self.off_until.fetch_max(until, Ordering::Relaxed);
    }
}

/// The moment gate times count from.
fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    base().elapsed().as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_first_slice_keeps_the_gate_open_and_a_long_one_closes_it() {
        let gate = InlineGate::default();
        assert!(gate.allows());
        gate.ran(Duration::from_micros(30));
        assert!(
            gate.allows(),
            "a short call, or one a tick happened to interrupt"
        );
        gate.ran(LONG_SLICE);
        assert!(!gate.allows(), "a long first slice");
        gate.ran(Duration::ZERO);
        assert!(
            !gate.allows(),
            "a short call does not reopen it before the cool-down"
        );
    }
}
