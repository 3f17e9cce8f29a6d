//! Group commit: the fenced commits of several messages sent as one atomic batch.
//!
//! At one replica on file storage, nats-server stages every atomic batch in a file store of
//! its own (`newBatchStore` in `server/jetstream_batching.go`), so a batch costs the server
//! milliseconds whatever it holds. Laying the waiting commits of one stream end to end in
//! one batch pays that once for all of them. Each commit keeps its own fence (its record
//! expects its own claim's revision), and the batch is still all or none:
//!
//! - stored: every member is committed; each record's sequence follows from its place;
//! - refused (a stale member's fence, or anything else the server answers with an error):
//!   nothing was stored, and each member is sent again as a batch of its own, so one stale
//!   owner costs the others a second round trip, never their commit;
//! - no answer: every member reads its own record back, as a lone commit would (rule 13).
//!
//! Commits queue per stream, and one batch of a stream is in flight from a host at a time
//! ([`run`]): what arrives meanwhile goes in the next one. So a lone message is sent at once,
//! alone, and batches grow only while the server is the bottleneck. A commit whose lease
//! lapsed by this host's clock while it waited (behind a batch whose answer was slow, or
//! never came: a host cut off waits for its request timeout) is not sent, as no write of a
//! lapsed lease is (another host, seeing the lapse, may have gone ahead: an exclusive
//! entity's next message); nor is it sent alone after a refused batch once it lapsed. (Measured: one batch in
//! flight beat two, three, four, and a batch per message, at one replica and at three:
//! BENCHMARKS.md.)
//!
//! The sending is the [`Batches`] seam: the host's adapter publishes over JetStream
//! (`host/src/fenced/group.rs`), the simulation's commits to its model server.

use std::future::Future;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::claim::record::virtual_clock::monotonic_ms;
use crate::claim::ClaimError;
use crate::revert::{self, Fix};

/// The most messages a group batch holds (the server takes 1,000 by default; one commit
/// alone may still hold up to that many).
pub const MAX_GROUP_MESSAGES: usize = 500;

/// How one batch of several commits ended at the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// Stored: the sequence of the batch's last message.
    Stored(u64),
    /// The server answered with an error: nothing of the batch was stored.
    Refused(String),
    /// No answer, or not taken after the sender's retries: it may or may not have landed.
    Unanswered(String),
}

/// How a fenced batch ended, as the host's metrics count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchResult {
    /// Stored: every commit in it landed.
    Committed,
    /// Refused by the server (a stale owner's fence, or another error): nothing stored, its
    /// commits sent again one by one.
    Refused,
    /// No answer (or not taken after the retries): each commit reads its record back.
    Unanswered,
}

impl BatchResult {
    /// The `result` label.
    pub fn label(self) -> &'static str {
        match self {
            BatchResult::Committed => "committed",
            BatchResult::Refused => "refused",
            BatchResult::Unanswered => "unanswered",
        }
    }
}

/// Where fenced commits are sent: one stream's atomic batches.
pub trait Batches {
    /// One message of a batch (an output or a claim record), before the batch headers.
    type Message: Send;

    /// Sends `messages` (several commits laid end to end) as one batch.
    fn send(&self, messages: &[Self::Message]) -> impl Future<Output = Sent> + Send;

    /// Sends one commit's `messages` as a batch of its own and answers as a lone commit does:
    /// its record's sequence, [`ClaimError::Conflict`] for a stale owner (nothing stored), or
    /// [`ClaimError::Unavailable`] when there was no answer.
    fn commit_alone(
        &self,
        messages: &[Self::Message],
    ) -> impl Future<Output = Result<u64, ClaimError>> + Send;
}

/// Sends several commits as one batch and answers each as [`Batches::commit_alone`] would
/// have: its record's sequence (its record is its commit's last message), a conflict for a
/// stale owner, or unavailable when there was no answer. Also says how the batch ended.
pub async fn commit_group<B: Batches + Sync>(
    batches: &B,
    commits: Vec<Vec<B::Message>>,
) -> (BatchResult, Vec<Result<u64, ClaimError>>) {
    let never = vec![u64::MAX; commits.len()];
    commit_leased(batches, commits, &never).await
}

/// Why a commit is answered without being sent: its lease lapsed by this host's clock.
fn lapsed() -> ClaimError {
    ClaimError::Unavailable(
        "fenced commit not sent: its lease lapsed by this host's clock while it waited for its batch"
            .into(),
    )
}

/// Whether a commit whose lease lapses at `lapses_at` ([`monotonic_ms`]) may no longer be
/// sent. (Reverted, test-only: it is sent whenever its batch goes.)
fn lapsed_now(lapses_at: u64) -> bool {
    monotonic_ms() >= lapses_at && !revert::reverted(Fix::GroupCommitLapse)
}

/// [`commit_group`] of commits whose leases lapse at `lapses_at` (one each): after a refused
/// batch, a commit whose lease lapsed meanwhile is not sent again alone.
async fn commit_leased<B: Batches + Sync>(
    batches: &B,
    mut commits: Vec<Vec<B::Message>>,
    lapses_at: &[u64],
) -> (BatchResult, Vec<Result<u64, ClaimError>>) {
    if commits.len() == 1 {
        let answer = batches.commit_alone(&commits[0]).await;
        let result = match &answer {
            Ok(_) => BatchResult::Committed,
            Err(ClaimError::Conflict) => BatchResult::Refused,
            Err(_) => BatchResult::Unanswered,
        };
        return (result, vec![answer]);
    }
    // Where each commit's record lands, counted from the batch's first message.
    let mut ends = Vec::with_capacity(commits.len());
    let mut messages = Vec::new();
    for commit in &mut commits {
        messages.append(commit);
        ends.push(messages.len());
    }
    let total = messages.len();
    match batches.send(&messages).await {
        Sent::Stored(last) => {
            tracing::debug!(
                commits = ends.len(),
                messages = total,
                "fenced group committed"
            );
            let answers = ends
                .into_iter()
                .map(|end| Ok(last - (total - end) as u64))
                .collect();
            (BatchResult::Committed, answers)
        }
        Sent::Refused(e) => {
            tracing::debug!(
                commits = ends.len(),
                "fenced group refused, committing each alone: {e}"
            );
            let mut rest = messages.into_iter();
            let mut start = 0;
            let own: Vec<Vec<B::Message>> = ends
                .into_iter()
                .map(|end| {
                    let own = rest.by_ref().take(end - start).collect();
                    start = end;
                    own
                })
                .collect();
            // Sent at once: one stale owner costs the others one round trip.
            let alone = own.iter().zip(lapses_at).map(|(messages, at)| async move {
                match lapsed_now(*at) {
                    true => Err(lapsed()),
                    false => batches.commit_alone(messages).await,
                }
            });
            let answers = futures::future::join_all(alone).await;
            (BatchResult::Refused, answers)
        }
        Sent::Unanswered(e) => {
            let answers = ends
                .iter()
                .map(|_| Err(ClaimError::Unavailable(e.clone())))
                .collect();
            (BatchResult::Unanswered, answers)
        }
    }
}

/// One waiting commit.
pub struct Member<M> {
    messages: Vec<M>,
    /// When its lease lapses by this host's clock ([`monotonic_ms`]).
    lapses_at: u64,
    done: oneshot::Sender<Result<u64, ClaimError>>,
}

/// The sending side of one stream's committer ([`run`]).
pub struct Queue<M>(mpsc::UnboundedSender<Member<M>>);

impl<M> Clone for Queue<M> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

/// A new committer queue: the [`Queue`] commits go in by, and what [`run`] takes them from.
pub fn queue<M>() -> (Queue<M>, mpsc::UnboundedReceiver<Member<M>>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (Queue(tx), rx)
}

impl<M> Queue<M> {
    /// Whether its committer stopped (then a new one is needed).
    pub fn is_closed(&self) -> bool {
        self.0.is_closed()
    }

    /// Commits `messages` (one commit's, its record last) in a batch with whatever else of
    /// the stream is waiting; answers like [`Batches::commit_alone`]. `left` is how long its
    /// lease has left by this host's clock (`Lease::left_locally`): once it ran out, the
    /// commit is not sent.
    pub async fn commit(&self, messages: Vec<M>, left: Duration) -> Result<u64, ClaimError> {
        let stopped =
            || ClaimError::Unavailable("fenced commit: the stream's committer stopped".into());
        let left = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
        let lapses_at = monotonic_ms().saturating_add(left);
        let (done, answer) = oneshot::channel();
        let member = Member {
            messages,
            lapses_at,
            done,
        };
        self.0.send(member).map_err(|_| stopped())?;
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }
}

/// A host's committers, one per fenced stream, each started at its stream's first commit.
///
/// The host's pipeline commits through them (`host/src/fenced/group.rs`, each committer a task
/// of its own), and so does each simulated host (its committers polled beside its deliveries).
pub struct Committers<M> {
    streams: std::sync::Mutex<std::collections::BTreeMap<String, Queue<M>>>,
}

impl<M> Default for Committers<M> {
    fn default() -> Self {
        Self {
            streams: std::sync::Mutex::new(std::collections::BTreeMap::new()),
        }
    }
}

impl<M> Committers<M> {
    /// Commits `messages` (one commit's, its record last) to fenced stream `stream`, and
    /// answers like [`Batches::commit_alone`]. A lone record (a commit without outputs) is not
    /// a batch and has nothing to share: `batches` sends it at once. Anything else waits in
    /// the stream's queue for a batch of its committer, and is not sent once its lease's
    /// `left` time (by this host's clock) ran out ([`Queue::commit`]); a stream without a
    /// committer (or whose committer stopped, which it never should) gets a new one, which
    /// `start` runs: it receives the new queue's members for [`run`].
    pub async fn commit<B: Batches<Message = M> + Sync>(
        &self,
        batches: &B,
        stream: &str,
        messages: Vec<M>,
        left: Duration,
        start: impl FnOnce(mpsc::UnboundedReceiver<Member<M>>),
    ) -> Result<u64, ClaimError> {
        if messages.len() < 2 {
            return batches.commit_alone(&messages).await;
        }
        let queue = {
            let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
            match streams.get(stream).filter(|q| !q.is_closed()) {
                Some(queue) => queue.clone(),
                None => {
                    let (queue, members) = queue();
                    start(members);
                    streams.insert(stream.to_string(), queue.clone());
                    queue
                }
            }
        };
        queue.commit(messages, left).await
    }
}

/// One stream's committer: sends every waiting commit that fits as one batch, waits for its
/// answer, and starts again with what arrived meanwhile; it ends when every [`Queue`] is
/// dropped. `ended` hears how many commits each batch held and how it ended, before any
/// member is answered (so metrics count the batch before anything the answers lead to).
pub async fn run<B: Batches + Sync>(
    batches: B,
    mut members: mpsc::UnboundedReceiver<Member<B::Message>>,
    mut ended: impl FnMut(usize, BatchResult),
) {
    let mut carried: Option<Member<B::Message>> = None;
    loop {
        let first = match carried.take() {
            Some(member) => member,
            None => match members.recv().await {
                Some(member) => member,
                None => return,
            },
        };
        let mut size = first.messages.len();
        let mut group = vec![first];
        while let Ok(member) = members.try_recv() {
            if size + member.messages.len() > MAX_GROUP_MESSAGES {
                carried = Some(member);
                break;
            }
            size += member.messages.len();
            group.push(member);
        }
        // What waited past its lease's end stays unsent.
        let (group, lapsed_members): (Vec<_>, Vec<_>) =
            group.into_iter().partition(|m| !lapsed_now(m.lapses_at));
        for member in lapsed_members {
            let _ = member.done.send(Err(lapsed()));
        }
        if group.is_empty() {
            continue;
        }
        let (mut commits, mut answers, mut lapses_at) = (Vec::new(), Vec::new(), Vec::new());
        for member in group {
            commits.push(member.messages);
            answers.push(member.done);
            lapses_at.push(member.lapses_at);
        }
        let (result, outcomes) = commit_leased(&batches, commits, &lapses_at).await;
        ended(answers.len(), result);
        for (outcome, done) in outcomes.into_iter().zip(answers) {
            let _ = done.send(outcome);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A stream whose batches end as `next` says; records every batch sent.
    struct Fake {
        next: Mutex<Vec<Sent>>,
        alone: Mutex<Vec<Vec<u64>>>,
        sent: Mutex<Vec<Vec<u64>>>,
    }

    impl Batches for Fake {
        type Message = u64;
        async fn send(&self, messages: &[u64]) -> Sent {
            self.sent.lock().unwrap().push(messages.to_vec());
            self.next.lock().unwrap().remove(0)
        }
        async fn commit_alone(&self, messages: &[u64]) -> Result<u64, ClaimError> {
            self.alone.lock().unwrap().push(messages.to_vec());
            match messages.last() {
                Some(0) => Err(ClaimError::Conflict),
                Some(m) => Ok(*m),
                None => Ok(0),
            }
        }
    }

    /// A lease's time left that does not run out during a test.
    const LONG: Duration = Duration::from_secs(3600);

    fn fake(next: Vec<Sent>) -> Fake {
        Fake {
            next: Mutex::new(next),
            alone: Mutex::new(Vec::new()),
            sent: Mutex::new(Vec::new()),
        }
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    #[test]
    fn a_stored_batch_answers_each_commit_with_its_records_sequence() {
        let f = fake(vec![Sent::Stored(105)]);
        let (result, answers) = block_on(commit_group(&f, vec![vec![1, 2], vec![3], vec![4, 5]]));
        assert_eq!(result, BatchResult::Committed);
        // Five messages end at 105: the records (2nd, 3rd, 5th) are 102, 103, 105.
        let answers: Vec<_> = answers.into_iter().map(Result::unwrap).collect();
        assert_eq!(answers, vec![102, 103, 105]);
        assert!(f.alone.lock().unwrap().is_empty());
    }

    #[test]
    fn a_refused_batch_sends_each_commit_alone_and_only_the_stale_one_fails() {
        let f = fake(vec![Sent::Refused("wrong last sequence".into())]);
        let (result, answers) = block_on(commit_group(&f, vec![vec![1, 7], vec![0], vec![9]]));
        assert_eq!(result, BatchResult::Refused);
        assert_eq!(*f.alone.lock().unwrap(), vec![vec![1, 7], vec![0], vec![9]]);
        assert!(matches!(answers[0], Ok(7)));
        assert!(matches!(answers[1], Err(ClaimError::Conflict)));
        assert!(matches!(answers[2], Ok(9)));
    }

    #[test]
    fn an_unanswered_batch_leaves_every_commit_unknown() {
        let f = fake(vec![Sent::Unanswered("timed out".into())]);
        let (result, answers) = block_on(commit_group(&f, vec![vec![1], vec![2]]));
        assert_eq!(result, BatchResult::Unanswered);
        assert!(answers
            .iter()
            .all(|a| matches!(a, Err(ClaimError::Unavailable(_)))));
        assert!(f.alone.lock().unwrap().is_empty());
    }

    #[test]
    fn a_lone_record_is_sent_alone_and_a_stopped_committer_is_replaced() {
        let f = fake(Vec::new());
        let committers = Committers::default();
        let started = Mutex::new(Vec::new());
        block_on(async {
            let alone = committers
                .commit(&f, "OUT", vec![5], LONG, |_| panic!("no batch"))
                .await;
            assert!(matches!(alone, Ok(5)));
            assert_eq!(*f.alone.lock().unwrap(), vec![vec![5]]);
            // The first commit with outputs starts the stream's committer; this one stops at
            // once (its receiver dropped), so the next commit gets a new one.
            let stopped = committers
                .commit(&f, "OUT", vec![1, 2], LONG, |members| {
                    started.lock().unwrap().push("first");
                    drop(members);
                })
                .await;
            assert!(matches!(stopped, Err(ClaimError::Unavailable(_))));
            let (tx, rx) = oneshot::channel();
            let committed = committers.commit(&f, "OUT", vec![2, 3], LONG, |members| {
                started.lock().unwrap().push("second");
                let _ = tx.send(members);
            });
            // Its committer runs until every queue is gone: answered, the commit is done.
            let runner = async {
                let members = rx.await.expect("started");
                run(fake(vec![Sent::Stored(3)]), members, |_, _| {}).await
            };
            let committed =
                match futures::future::select(Box::pin(committed), Box::pin(runner)).await {
                    futures::future::Either::Left((committed, _)) => committed,
                    futures::future::Either::Right(_) => panic!("the committer ended first"),
                };
            assert!(matches!(committed, Ok(3)));
        });
        assert_eq!(*started.lock().unwrap(), vec!["first", "second"]);
    }

    #[test]
    fn a_commit_whose_lease_lapsed_while_it_waited_is_not_sent() {
        let f = fake(vec![Sent::Stored(2)]);
        let (q, rx) = queue();
        let counted = std::sync::Arc::new(Mutex::new(Vec::new()));
        let seen = counted.clone();
        block_on(async move {
            let (a, b) = (q.clone(), q.clone());
            let live = tokio::spawn(async move { a.commit(vec![1, 2], LONG).await });
            // Its lease ran out as it waited for the batch in flight.
            let gone = tokio::spawn(async move { b.commit(vec![3, 4], Duration::ZERO).await });
            tokio::task::yield_now().await;
            drop(q);
            let runner = tokio::spawn(run(f, rx, move |n, r| seen.lock().unwrap().push((n, r))));
            assert!(matches!(live.await.unwrap(), Ok(2)));
            let gone = gone.await.unwrap();
            assert!(
                matches!(&gone, Err(ClaimError::Unavailable(e)) if e.contains("lapsed")),
                "{gone:?}"
            );
            runner.await.unwrap();
        });
        // One commit went out, alone: the lapsed one was never sent.
        assert_eq!(*counted.lock().unwrap(), vec![(1, BatchResult::Committed)]);
    }

    #[test]
    fn the_committer_groups_what_waits_and_counts_each_batch_before_answering() {
        let f = fake(vec![Sent::Stored(4)]);
        let (q, rx) = queue();
        let counted = std::sync::Arc::new(Mutex::new(Vec::new()));
        let seen = counted.clone();
        block_on(async move {
            let (a, b) = (q.clone(), q.clone());
            let first = tokio::spawn(async move { a.commit(vec![1, 2], LONG).await });
            let second = tokio::spawn(async move { b.commit(vec![3, 4], LONG).await });
            tokio::task::yield_now().await;
            drop(q);
            let runner = tokio::spawn(run(f, rx, move |n, r| seen.lock().unwrap().push((n, r))));
            assert!(matches!(first.await.unwrap(), Ok(2)));
            assert!(matches!(second.await.unwrap(), Ok(4)));
            runner.await.unwrap();
        });
        assert_eq!(*counted.lock().unwrap(), vec![(2, BatchResult::Committed)]);
    }
}
