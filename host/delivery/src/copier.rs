//! The copier of an exclusive route: the one host that copies the route's source messages onto
//! its work queue, many at a time. The route's source consumer hands its messages to one
//! pinned host (a priority group with a pinned client, a window of `max_ack_pending`); that
//! host sends their copies without waiting for each other's stored acks, and acks each source
//! message once its copy is stored ([`crate::queue`]).
//!
//! Order per entity rests on three things:
//! - **one copier at a time**: every copy is fenced on the route's *epoch*, the sequence of
//!   the last message on its order subject; a host becomes the copier by writing a new epoch
//!   there, compare-and-swap, so a host that lost the pin (paused, cut off) stores nothing
//!   more once another took over. Only the pinned host takes over (its delivery's pin is the
//!   consumer's): a paused host that resumes with stale deliveries hands them back instead of
//!   fencing out the host that holds the pin;
//! - **a takeover copies what the last copier may have left**: after writing its epoch, the
//!   new copier reads the consumer's ack floor and last delivered sequence and copies every
//!   route message between them from the source stream, in order (a copy already stored is
//!   dropped by its dedup id), before any copy of its own deliveries; whatever the old copier
//!   held unacked is in that range;
//! - **a chain per entity**: a copy waits until the previous copy of its entity is stored or
//!   failed; a failed copy ends the epoch, so the next copy takes over again and its range
//!   copies the failed one first (without the chain, a copy lost in a reconnect could be
//!   followed by a stored later copy of the same entity).
//!
//! The host runs it over JetStream (its pipeline's `copier.rs`), the simulation over its
//! model: the seam is [`CopierIo`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;

use tokio::sync::watch;

/// The epoch a host copies under: the order subject's sequence it wrote, and the last source
/// sequence its takeover copied (a copy of a message at or below it that was refused for a
/// newer epoch of this host's was stored by that takeover).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Epoch {
    /// The sequence of the host's epoch message on the order subject.
    pub sequence: u64,
    /// The consumer's last delivered source sequence when the takeover read it.
    pub covered_through: u64,
}

/// The epoch a host holds, and the pin its takeover was made under.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    epoch: Epoch,
    pin: Option<String>,
}

/// Why the queue did not store a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The route's order subject moved on: another epoch.
    Epoch,
    /// Never storable (larger than the server accepts, or no entity to store it under).
    ForGood(String),
    /// No answer, or another refusal.
    Other(String),
}

/// Why a delivery's copy was not stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyError {
    /// Never storable (too big): dead-letter the message.
    ForGood(String),
    /// This host is not the route's copier (another took over, or the consumer's pin is
    /// elsewhere): hand the message back at once for the copier, not an outage.
    NotCopier(String),
    /// Not now (no answer): hand the message back after the outage backoff.
    Transient(String),
}

/// The route's source consumer as a takeover reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// Its ack floor: every message at or below it is acked (copied).
    pub floor: u64,
    /// The last stream sequence it delivered.
    pub delivered: u64,
    /// The pin id of the host it hands its messages to (`None`: no host pinned).
    pub pinned: Option<String>,
}

/// What the copier reads and writes.
pub trait CopierIo: Sync {
    /// The sequence of the route's last epoch message (0: none yet).
    fn last_epoch(&self) -> impl Future<Output = Result<u64, String>> + Send;

    /// Writes a new epoch expecting `last` as the last one; its sequence, or why not
    /// ([`Refused::Epoch`]: another host wrote one meanwhile).
    fn write_epoch(&self, last: u64) -> impl Future<Output = Result<u64, Refused>> + Send;

    /// The route's source consumer's ack floor, last delivered stream sequence and pin.
    fn window(&self) -> impl Future<Output = Result<Window, String>> + Send;

    /// Copies the route's first source message after `after` and at most `through` under
    /// `epoch`, and returns its sequence (`None`: there is none). A message with no entity, or
    /// too big, is skipped (its own delivery dead-letters it).
    fn copy_next(
        &self,
        after: u64,
        through: u64,
        epoch: u64,
    ) -> impl Future<Output = Result<Option<u64>, Refused>> + Send;
}

/// One route's copier on a host: its epoch, and the chain of copies per entity.
#[derive(Default)]
pub struct Copier {
    epoch: tokio::sync::Mutex<Option<Held>>,
    /// Per entity, whether its latest copy handed out a turn is done (`Some(stored)`).
    chains: Mutex<HashMap<String, watch::Receiver<Option<bool>>>>,
}

/// A delivery's place in its entity's chain: it waits for the one before, and says when done
/// (dropped without a word: failed).
pub struct Turn {
    before: Option<watch::Receiver<Option<bool>>>,
    done: watch::Sender<Option<bool>>,
}

impl Turn {
    /// Waits until the previous copy of the entity is stored or failed.
    async fn wait(&self) {
        if let Some(mut before) = self.before.clone() {
            // A sender dropped ended as failed: nothing more to wait for.
            let _ = before.wait_for(|d| d.is_some()).await;
        }
    }

    /// This copy is done: `stored`, or failed.
    pub fn done(&self, stored: bool) {
        self.done.send_replace(Some(stored));
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.done.send_if_modified(|d| {
            let unset = d.is_none();
            if unset {
                *d = Some(false);
            }
            unset
        });
    }
}

impl Copier {
    /// The turn of a delivery of `entity` among its entity's copies, taken in the order the
    /// deliveries are handed out (before their work starts). A delivery with no entity waits
    /// for none (it is dead-lettered, never copied).
    pub fn turn(&self, entity: Option<&str>) -> Turn {
        let (done, rx) = watch::channel(None);
        let Some(entity) = entity else {
            return Turn { before: None, done };
        };
        let mut chains = self.chains.lock().expect("chains lock");
        chains.retain(|_, r| r.borrow().is_none());
        let before = chains.insert(entity.to_string(), rx);
        Turn { before, done }
    }

    /// Copies the delivery of source sequence `sequence`, handed out under pin `pin`, with
    /// `copy` (given the epoch to fence on), after its entity's previous copy, under this
    /// host's epoch (taking over first when it has none). `turn` is told how it ended.
    pub async fn copy<Io, F, Fut>(
        &self,
        io: &Io,
        turn: &Turn,
        (sequence, pin): (u64, Option<&str>),
        copy: F,
    ) -> Result<(), CopyError>
    where
        Io: CopierIo,
        F: FnOnce(u64) -> Fut,
        Fut: Future<Output = Result<(), Refused>>,
    {
        turn.wait().await;
        let copied = self.copy_in_turn(io, (sequence, pin), copy).await;
        turn.done(copied.is_ok());
        copied
    }

    async fn copy_in_turn<Io, F, Fut>(
        &self,
        io: &Io,
        (sequence, pin): (u64, Option<&str>),
        copy: F,
    ) -> Result<(), CopyError>
    where
        Io: CopierIo,
        F: FnOnce(u64) -> Fut,
        Fut: Future<Output = Result<(), Refused>>,
    {
        let epoch = self.epoch(io, pin).await?;
        match copy(epoch.sequence).await {
            Ok(()) => Ok(()),
            Err(Refused::ForGood(e)) => Err(CopyError::ForGood(e)),
            Err(Refused::Epoch) => {
                // This host took over again meanwhile: a message its takeover covered is
                // stored. Another host took over: hand the message back to it.
                let now = self.epoch.lock().await.as_ref().map(|h| h.epoch);
                if now.is_some_and(|n| n != epoch && sequence <= n.covered_through) {
                    return Ok(());
                }
                self.lost(epoch).await;
                Err(CopyError::NotCopier(
                    "another host copies the route's messages now".into(),
                ))
            }
            Err(Refused::Other(e)) => {
                self.lost(epoch).await;
                Err(CopyError::Transient(e))
            }
        }
    }

    /// Forgets `epoch` if it is still this host's: the next copy takes over again.
    async fn lost(&self, epoch: Epoch) {
        let mut now = self.epoch.lock().await;
        if now.as_ref().is_some_and(|h| h.epoch == epoch) {
            *now = None;
        }
    }

    /// This host's epoch, taking over when it has none, or when `pin` is not the one it took
    /// over under, and `pin` is the consumer's. A new pin id means the pin moved: this host's
    /// lapsed (a pause, a pull stream made again) and the server may have handed messages to
    /// another host that stopped before it took over; copying on under the old epoch would
    /// store this delivery before those, redelivered later (out of order). A takeover copies
    /// them first.
    async fn epoch<Io: CopierIo>(&self, io: &Io, pin: Option<&str>) -> Result<Epoch, CopyError> {
        let mut epoch = self.epoch.lock().await;
        if let Some(held) = epoch.as_ref() {
            if pin.is_none() || pin == held.pin.as_deref() {
                return Ok(held.epoch);
            }
        }
        let taken = take_over(io, pin).await?;
        tracing::info!(
            epoch = taken.sequence,
            covered_through = taken.covered_through,
            "copying an exclusive route's messages onto its queue"
        );
        *epoch = Some(Held {
            epoch: taken,
            pin: pin.map(str::to_string),
        });
        Ok(taken)
    }
}

/// Whether `pin` has the shape of a pin id nats-server gives a pinned client: a nuid, 22
/// ASCII letters and digits (a producer's header block that does not end in an empty line
/// makes the server's pin run into its last header: any other shape is such a mangled block).
pub fn is_server_pin(pin: &str) -> bool {
    pin.len() == 22 && pin.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Becomes the copier, when the delivery's `pin` is the consumer's (a host holding stale
/// deliveries after a pause must not fence out the pinned one): writes a new epoch after the
/// last one, then copies, one at a time and in order, what the consumer handed out and nobody
/// acked (its ack floor to its last delivered sequence) under that epoch. One at a time: a
/// copy lost in a reconnect must not be followed by a stored later one of its entity (a range
/// is about a window of messages).
async fn take_over<Io: CopierIo>(io: &Io, pin: Option<&str>) -> Result<Epoch, CopyError> {
    let pinned = io.window().await.map_err(CopyError::Transient)?.pinned;
    if pinned.as_deref() != pin {
        return Err(CopyError::NotCopier(format!(
            "the route's source consumer hands its messages to {} now",
            pinned.map_or("no host".into(), |p| format!("pin {p}"))
        )));
    }
    let last = io.last_epoch().await.map_err(CopyError::Transient)?;
    let sequence = match io.write_epoch(last).await {
        Ok(sequence) => sequence,
        Err(Refused::Epoch) => {
            return Err(CopyError::NotCopier(
                "another host took over meanwhile".into(),
            ))
        }
        Err(Refused::ForGood(e) | Refused::Other(e)) => return Err(CopyError::Transient(e)),
    };
    let window = io.window().await.map_err(CopyError::Transient)?;
    let (mut after, delivered) = (window.floor, window.delivered);
    // Reverted (test-only): nothing the last copier left is copied first.
    if crate::revert::reverted(crate::revert::Fix::CopierRange) {
        after = delivered;
    }
    while after < delivered {
        match io.copy_next(after, delivered, sequence).await {
            Ok(Some(copied)) => after = copied,
            Ok(None) => break,
            Err(Refused::Epoch) => {
                return Err(CopyError::NotCopier(
                    "another host took over meanwhile".into(),
                ))
            }
            Err(Refused::ForGood(e) | Refused::Other(e)) => {
                return Err(CopyError::Transient(format!(
                    "cannot copy what the last copier left: {e}"
                )))
            }
        }
    }
    Ok(Epoch {
        sequence,
        covered_through: delivered,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex as StdMutex;

    /// A queue in memory: its epoch, and the source sequences stored in order.
    #[derive(Default)]
    struct Memory {
        epoch: StdMutex<u64>,
        stored: StdMutex<Vec<u64>>,
        source: Vec<u64>,
        window: StdMutex<(u64, u64)>,
        pinned: StdMutex<Option<String>>,
    }

    impl CopierIo for Memory {
        async fn last_epoch(&self) -> Result<u64, String> {
            Ok(*self.epoch.lock().unwrap())
        }
        async fn write_epoch(&self, last: u64) -> Result<u64, Refused> {
            let mut e = self.epoch.lock().unwrap();
            if *e != last {
                return Err(Refused::Epoch);
            }
            *e += 1;
            Ok(*e)
        }
        async fn window(&self) -> Result<Window, String> {
            let (floor, delivered) = *self.window.lock().unwrap();
            Ok(Window {
                floor,
                delivered,
                pinned: self.pinned.lock().unwrap().clone(),
            })
        }
        async fn copy_next(
            &self,
            after: u64,
            through: u64,
            epoch: u64,
        ) -> Result<Option<u64>, Refused> {
            let Some(&s) = self.source.iter().find(|s| **s > after && **s <= through) else {
                return Ok(None);
            };
            self.store(s, epoch)?;
            Ok(Some(s))
        }
    }

    impl Memory {
        fn store(&self, s: u64, epoch: u64) -> Result<(), Refused> {
            if *self.epoch.lock().unwrap() != epoch {
                return Err(Refused::Epoch);
            }
            let mut stored = self.stored.lock().unwrap();
            if !stored.contains(&s) {
                stored.push(s);
            }
            Ok(())
        }
    }

    fn run<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn a_takeover_copies_what_the_last_copier_left_before_its_own_deliveries() {
        // Messages 1-5 were handed out; 1 and 2 acked; the new copier's first delivery is 6.
        let io = Memory {
            source: vec![1, 2, 3, 4, 5, 6],
            window: StdMutex::new((2, 5)),
            stored: StdMutex::new(vec![1, 2]),
            ..Default::default()
        };
        let copier = Copier::default();
        let turn = copier.turn(Some("e"));
        let io = &io;
        let six = (6, None);
        run(copier.copy(io, &turn, six, |epoch| async move { io.store(6, epoch) })).unwrap();
        assert_eq!(*io.stored.lock().unwrap(), vec![1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn a_copier_that_lost_its_epoch_stores_nothing_and_takes_over_on_its_next_copy() {
        let io = Memory {
            source: vec![1, 2, 3],
            ..Default::default()
        };
        let (a, b) = (Copier::default(), Copier::default());
        let io = &io;
        let copy = |c: &Copier, s: u64, pin: &str| {
            let turn = c.turn(Some("e"));
            let handed = (s, Some(pin));
            run(c.copy(io, &turn, handed, |epoch| async move { io.store(s, epoch) }))
        };
        let pin = |p: &str| *io.pinned.lock().unwrap() = Some(p.into());
        pin("a");
        copy(&a, 1, "a").unwrap();
        pin("b");
        copy(&b, 2, "b").unwrap(); // b took over
        assert_eq!(
            copy(&a, 3, "a"),
            Err(CopyError::NotCopier(
                "another host copies the route's messages now".into()
            ))
        );
        // A stale delivery of a's does not take over again while b holds the pin.
        assert!(matches!(copy(&a, 3, "a"), Err(CopyError::NotCopier(_))));
        assert_eq!(*io.stored.lock().unwrap(), vec![1, 2]);
        copy(&b, 3, "b").unwrap();
        pin("a");
        copy(&a, 4, "a").unwrap(); // pinned again, a takes over
        assert_eq!(*io.stored.lock().unwrap(), vec![1, 2, 3, 4]);
    }

    /// a copies 1 under its pin; the pin lapses and moves to b, which is handed 2 and stops
    /// before it takes over; the server pins a again, under a new pin id. a's delivery of 3
    /// takes over again, so 2 (delivered, not acked) is copied before 3.
    #[test]
    fn a_host_pinned_again_takes_over_again_so_what_another_was_handed_goes_first() {
        let io = Memory {
            source: vec![1, 2, 3],
            ..Default::default()
        };
        let a = Copier::default();
        let io = &io;
        let copy = |s: u64, pin: &str| {
            let turn = a.turn(Some("e"));
            let handed = (s, Some(pin));
            run(a.copy(io, &turn, handed, |epoch| async move { io.store(s, epoch) }))
        };
        *io.pinned.lock().unwrap() = Some("a1".into());
        copy(1, "a1").unwrap();
        // 1 acked; 2 handed to b, never acked; a pinned again.
        *io.window.lock().unwrap() = (1, 2);
        *io.pinned.lock().unwrap() = Some("a2".into());
        copy(3, "a2").unwrap();
        assert_eq!(*io.stored.lock().unwrap(), vec![1, 2, 3]);
    }

    #[test]
    fn a_copy_waits_for_the_one_before_it_of_its_entity_and_not_for_others() {
        let copier = Copier::default();
        let first = copier.turn(Some("e"));
        let other = copier.turn(Some("f"));
        let second = copier.turn(Some("e"));
        assert!(other.before.is_none() && first.before.is_none());
        let mut waits = second.before.clone().unwrap();
        assert_eq!(*waits.borrow_and_update(), None);
        drop(first); // ended without a word: failed
        assert_eq!(*waits.borrow(), Some(false));
    }
}
