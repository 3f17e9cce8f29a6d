//! A canary's health: which keys it runs (a stable hash of the idempotency key, so a key's
//! retries and repeats always meet the same version) and a sliding window of each version's
//! outcomes, compared against the [`Margins`].

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use sha2::{Digest as _, Sha256};

use super::spec::Margins;

/// Whether `key` is one of the `percent` % of keys a canary runs.
pub fn runs_on_candidate(key: &str, percent: u8) -> bool {
    let hash = Sha256::digest(key.as_bytes());
    let n = u16::from_be_bytes([hash[0], hash[1]]);
    u32::from(n) * 100 < u32::from(percent) * 65_536
}

/// How a run ended, as the window counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Succeeded.
    Success,
    /// Rejected (dead-lettered).
    Reject,
    /// Asked to be retried.
    Retry,
    /// Trapped.
    Trap,
}

/// Runs of a version whose time is not counted: a new version's first runs instantiate cold
/// (fresh instance slots, first-touch pages) and took milliseconds where warm runs take
/// microseconds, which rolled back healthy candidates.
const WARM_UP_RUNS: usize = 20;
/// Timed runs each version needs before p99 times are compared: with fewer, the "p99" is
/// the slowest run, one scheduling hiccup.
const MIN_TIMED_RUNS: usize = 100;
/// Differences of p99 below this never decide: microsecond jitter on a busy machine.
const P99_FLOOR: Duration = Duration::from_millis(5);

#[derive(Debug, Default)]
struct Window {
    /// Outcomes and times (`None` during the warm-up) of the last runs.
    runs: VecDeque<(Ended, Option<Duration>)>,
    /// Runs seen in all.
    seen: usize,
}

impl Window {
    fn push(&mut self, ended: Ended, time: Duration, size: usize) {
        if self.runs.len() == size {
            self.runs.pop_front();
        }
        self.seen += 1;
        let timed = (self.seen > WARM_UP_RUNS).then_some(time);
        self.runs.push_back((ended, timed));
    }

    fn timed(&self) -> usize {
        self.runs.iter().filter(|(_, t)| t.is_some()).count()
    }

    fn rate(&self, ended: Ended) -> f64 {
        let n = self.runs.iter().filter(|(e, _)| *e == ended).count();
        n as f64 / self.runs.len().max(1) as f64
    }

    fn p99(&self) -> Duration {
        let mut times: Vec<Duration> = self.runs.iter().filter_map(|(_, t)| *t).collect();
        times.sort();
        let i = (times.len() * 99).div_ceil(100).saturating_sub(1);
        times.get(i).copied().unwrap_or_default()
    }
}

/// The two versions' recent runs on one host.
#[derive(Debug, Default)]
pub struct Health {
    windows: Mutex<[Window; 2]>,
}

impl Health {
    /// Records a run of the candidate (`candidate`) or the live version; returns why the
    /// candidate must be rolled back, once it is worse than `margins` allow.
    pub fn record(
        &self,
        candidate: bool,
        ended: Ended,
        time: Duration,
        margins: &Margins,
    ) -> Option<String> {
        let mut w = self.windows.lock().expect("canary window lock");
        w[usize::from(candidate)].push(ended, time, margins.window);
        let [live, cand] = &*w;
        if cand.runs.len() < margins.min_runs {
            return None;
        }
        for (ended, margin, what) in [
            (Ended::Reject, margins.rejects, "rejects"),
            (Ended::Trap, margins.traps, "traps"),
            (Ended::Retry, margins.retries, "retries"),
        ] {
            let (c, l) = (cand.rate(ended), live.rate(ended));
            if c - l > margin {
                return Some(format!(
                    "the candidate {what} {:.0}% of its last {} runs against {:.0}% of the live version's last {} (margin {:.0} points)",
                    c * 100.0,
                    cand.runs.len(),
                    l * 100.0,
                    live.runs.len(),
                    margin * 100.0
                ));
            }
        }
        let timed = MIN_TIMED_RUNS.min(margins.window);
        if live.timed() >= timed && cand.timed() >= timed {
            let (c, l) = (cand.p99(), live.p99());
            if c > l.max(P99_FLOOR).mul_f64(margins.p99_ratio) {
                return Some(format!(
                    "the candidate's p99 guest time {c:?} is over {}x the live version's {l:?}",
                    margins.p99_ratio
                ));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_of_keys_is_stable_and_near_its_percentage() {
        let keys: Vec<String> = (0..10_000).map(|i| format!("k-{i}")).collect();
        let on = keys.iter().filter(|k| runs_on_candidate(k, 20)).count();
        assert!((1_700..2_300).contains(&on), "{on}");
        assert!(keys
            .iter()
            .all(|k| runs_on_candidate(k, 20) == runs_on_candidate(k, 20)));
        // A wider share keeps every key of a narrower one.
        assert!(keys
            .iter()
            .filter(|k| runs_on_candidate(k, 20))
            .all(|k| runs_on_candidate(k, 50)));
    }

    #[test]
    fn a_candidate_rejecting_half_is_rolled_back_and_a_healthy_one_is_not() {
        let margins = Margins::default();
        let ms = Duration::from_millis(1);
        let healthy = Health::default();
        for _ in 0..100 {
            assert_eq!(healthy.record(false, Ended::Success, ms, &margins), None);
            assert_eq!(healthy.record(true, Ended::Success, ms, &margins), None);
        }
        let bad = Health::default();
        let mut verdict = None;
        for i in 0..100 {
            bad.record(false, Ended::Success, ms, &margins);
            let ended = if i % 2 == 0 {
                Ended::Reject
            } else {
                Ended::Success
            };
            verdict = verdict.or(bad.record(true, ended, ms, &margins));
        }
        assert!(verdict.unwrap().contains("rejects 50%"));
        let slow = Health::default();
        let mut verdict = None;
        for _ in 0..150 {
            slow.record(false, Ended::Success, ms, &margins);
            verdict = verdict.or(slow.record(true, Ended::Success, ms * 20, &margins));
        }
        assert!(verdict.unwrap().contains("p99"));
        // A cold start, then a few hiccups, never decide; nor does jitter under the floor.
        let cold = Health::default();
        for i in 0..300 {
            let cand = match i {
                0..20 => ms * 50,
                150 => ms * 40,
                _ => ms * 4,
            };
            assert_eq!(cold.record(false, Ended::Success, ms / 2, &margins), None);
            assert_eq!(
                cold.record(true, Ended::Success, cand, &margins),
                None,
                "{i}"
            );
        }
    }
}
