//! This host's queued deliveries in progress, by queue subject: a delivery behind one of its
//! own subject on this host needs no read to know it (the earlier one's copy stays in the
//! queue until it ends), and is woken as soon as a delivery of its subject here ends, instead
//! of at its next read ([`dedup_delivery::ahead`]). A copy this host acked or terminated may
//! still be in the queue for a moment (the server deletes it once it has processed the ack):
//! a read that finds it looks past it. Deliveries on other hosts are seen only by the reads.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// The queued deliveries in progress on this host.
#[derive(Default)]
pub(super) struct InProgress {
    subjects: Mutex<HashMap<String, Subject>>,
    /// Copies found at or below their partition's ack floor yet still stored, latest last:
    /// once found so twice, looked past by the reads until the sweep of undeliverable messages
    /// has deleted them.
    passed: Mutex<VecDeque<Below>>,
}

/// A copy found at or below its partition's ack floor, yet still stored.
struct Below {
    subject: String,
    sequence: u64,
    /// When it was first found so.
    found: Instant,
    /// When it was found so again, at least [`BELOW_FOR`] later: looked past from then on.
    passed: Option<Instant>,
}

/// How long a copy must stay at or below its partition's ack floor, still stored, to be looked
/// past: an acked copy stays stored for a moment after the ack floor moved past it (the server
/// deletes it once it has processed the ack), and is found so by a read in that moment.
const BELOW_FOR: Duration = Duration::from_secs(5);

/// A first finding older than this is not confirmed by a second one: it is found afresh.
const BELOW_STALE: Duration = Duration::from_secs(600);

/// How many passed copies are remembered: each is one host's read of its partition's ack
/// floor to find again once forgotten.
const PASSED_KEPT: usize = 1024;

/// How long a passed copy is looked past: the sweep (every 10 s) deletes it well within this,
/// and a queue stream made again meanwhile (its sequences starting over) is not misread for
/// long.
const PASSED_FOR: Duration = Duration::from_secs(60);

/// How many of a subject's copies this host ended are remembered while it has deliveries of
/// the subject in progress.
const ENDED_KEPT: usize = 64;

/// One queue subject's deliveries in progress here, and their end.
struct Subject {
    sequences: BTreeSet<u64>,
    /// How many of them ended so far.
    ended: Arc<watch::Sender<u64>>,
    /// The latest copies of the subject whose deliveries here ended them (acked, terminated).
    gone: VecDeque<u64>,
}

impl InProgress {
    /// Records queued delivery `sequence` on `subject` until the returned guard drops; it
    /// ended its copy if `ended` is then set.
    pub(super) fn enter<'a>(
        &'a self,
        subject: &str,
        sequence: u64,
        ended: &'a AtomicBool,
    ) -> Entered<'a> {
        let mut subjects = self.subjects.lock().expect("in-progress map");
        let s = subjects
            .entry(subject.to_string())
            .or_insert_with(|| Subject {
                sequences: BTreeSet::new(),
                ended: Arc::new(watch::Sender::new(0)),
                gone: VecDeque::new(),
            });
        s.sequences.insert(sequence);
        let seen = *s.ended.borrow();
        Entered {
            local: self,
            subject: subject.to_string(),
            sequence,
            seen: AtomicU64::new(seen),
            ended: s.ended.clone(),
            ended_copy: ended,
        }
    }
}

/// A queued delivery in progress on this host.
pub(super) struct Entered<'a> {
    local: &'a InProgress,
    subject: String,
    sequence: u64,
    /// The subject's end count when this delivery last looked.
    seen: AtomicU64,
    ended: Arc<watch::Sender<u64>>,
    /// Whether the delivery ended its copy (`Delivery::ended`).
    ended_copy: &'a AtomicBool,
}

impl Entered<'_> {
    /// The earliest delivery of this subject in progress here before this one, if any.
    pub(super) fn earlier(&self) -> Option<u64> {
        let subjects = self.local.subjects.lock().expect("in-progress map");
        let s = subjects.get(&self.subject)?;
        s.sequences.first().copied().filter(|f| *f < self.sequence)
    }

    /// Whether a delivery of this host ended copy `sequence` of this subject lately.
    pub(super) fn gone_here(&self, sequence: u64) -> bool {
        let subjects = self.local.subjects.lock().expect("in-progress map");
        let s = subjects.get(&self.subject);
        s.is_some_and(|s| s.gone.contains(&sequence))
    }

    /// Whether copy `sequence` of this subject is looked past ([`Entered::pass`]).
    pub(super) fn passed(&self, sequence: u64) -> bool {
        let passed = self.local.passed.lock().expect("passed copies");
        (passed.iter()).any(|b| {
            b.sequence == sequence
                && b.subject == self.subject
                && b.passed.is_some_and(|at| at.elapsed() < PASSED_FOR)
        })
    }

    /// Records that copy `sequence` of this subject was found at `now` at or below its
    /// partition's ack floor, still stored; whether it is looked past from now on: found so
    /// [`BELOW_FOR`] earlier too, it is no acked copy about to be deleted.
    pub(super) fn pass(&self, sequence: u64, now: Instant) -> bool {
        let mut passed = self.local.passed.lock().expect("passed copies");
        let found =
            (passed.iter_mut()).find(|b| b.sequence == sequence && b.subject == self.subject);
        if let Some(b) = found {
            let since = now.saturating_duration_since(b.found);
            if b.passed.is_none() && since >= BELOW_FOR && since < BELOW_STALE {
                b.passed = Some(now);
            } else if since >= BELOW_STALE {
                (b.found, b.passed) = (now, None);
            }
            return b.passed.is_some();
        }
        if passed.len() == PASSED_KEPT {
            passed.pop_front();
        }
        passed.push_back(Below {
            subject: self.subject.clone(),
            sequence,
            found: now,
            passed: None,
        });
        false
    }

    /// Waits `delay`, or until a delivery of this subject here ends (then `true`, at once if
    /// one ended since this delivery last looked: while it read, say).
    pub(super) async fn wait(&self, delay: Duration) -> bool {
        let mut ends = self.ended.subscribe();
        let now = *ends.borrow_and_update();
        if self.seen.swap(now, Ordering::Relaxed) != now {
            return true;
        }
        let woken = tokio::time::timeout(delay, ends.changed()).await.is_ok();
        self.seen.store(*ends.borrow(), Ordering::Relaxed);
        woken
    }
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        let mut subjects = self.local.subjects.lock().expect("in-progress map");
        if let Some(s) = subjects.get_mut(&self.subject) {
            s.sequences.remove(&self.sequence);
            if self.ended_copy.load(Ordering::Relaxed) {
                if s.gone.len() == ENDED_KEPT {
                    s.gone.pop_front();
                }
                s.gone.push_back(self.sequence);
            }
            if s.sequences.is_empty() {
                subjects.remove(&self.subject);
            }
        }
        self.ended.send_modify(|ended| *ended += 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_delivery_sees_an_earlier_one_of_its_subject_here_and_wakes_when_it_ends() {
        let local = InProgress::default();
        let (acked, not_yet) = (AtomicBool::new(true), AtomicBool::new(false));
        let first = local.enter("q.0.a", 3, &acked);
        let second = local.enter("q.0.a", 7, &not_yet);
        let other = local.enter("q.0.b", 1, &not_yet);
        assert_eq!(first.earlier(), None);
        assert_eq!(second.earlier(), Some(3));
        assert_eq!(other.earlier(), None);
        let woken = async {
            let woken = second.wait(Duration::from_secs(3600)).await;
            (woken, second.earlier())
        };
        let (earlier, ()) = tokio::join!(woken, async {
            tokio::task::yield_now().await;
            drop(first);
        });
        assert_eq!(earlier, (true, None));
        assert!(second.gone_here(3));
        assert!(!other.gone_here(3));
        // Found below the ack floor once, then again 5 s later: looked past from then on.
        let now = Instant::now();
        assert!(!second.pass(2, now) && !second.passed(2));
        assert!(!second.pass(2, now + Duration::from_secs(1)) && !second.passed(2));
        assert!(second.pass(2, now + BELOW_FOR));
        assert!(second.passed(2) && !second.passed(3) && !other.passed(2));
        assert!(!other.wait(Duration::from_millis(1)).await);
        // An end while a delivery was not waiting (reading, say) wakes its next wait at once.
        let third = local.enter("q.0.a", 9, &not_yet);
        let fourth = local.enter("q.0.a", 11, &not_yet);
        drop(third);
        assert!(fourth.wait(Duration::from_secs(3600)).await);
        drop(fourth);
        drop((second, other));
        assert!(local.subjects.lock().unwrap().is_empty());
    }
}
