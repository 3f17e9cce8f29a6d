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
//! Commits queue per stream, and one batch of a stream is in flight from a host at a time:
//! what arrives meanwhile goes in the next one. So a lone message is sent at once, alone,
//! and batches grow only while the server is the bottleneck. (Measured: one batch in flight
//! beat two, three, four, and a batch per message, at one replica and at three:
//! BENCHMARKS.md.)

use std::collections::HashMap;
use std::sync::Mutex;

use async_nats::jetstream::Context;
use tokio::sync::{mpsc, oneshot};

use super::commit::{commit_prepared, send_batch, BatchMessage, Failure};
use crate::claim::ClaimError;
use crate::metrics::{BatchResult, BatchSeries};

/// The most messages a group batch holds (the server takes 1,000 by default; one commit
/// alone may still hold up to that many).
pub const MAX_GROUP_MESSAGES: usize = 500;

/// One waiting commit.
struct Member {
    messages: Vec<BatchMessage>,
    done: oneshot::Sender<Result<u64, ClaimError>>,
}

/// The group committers of one host, one per fenced stream, started at first use.
pub struct GroupCommits {
    js: Context,
    series: BatchSeries,
    streams: Mutex<HashMap<String, mpsc::UnboundedSender<Member>>>,
}

impl GroupCommits {
    /// Committers sending through `js`, counting their batches in `series`.
    pub fn new(js: Context, series: BatchSeries) -> Self {
        Self {
            js,
            series,
            streams: Mutex::new(HashMap::new()),
        }
    }

    /// Commits `messages` (one commit's, from [`super::commit::prepare`]) to fenced stream
    /// `stream`, in a batch with whatever else of that stream is waiting. Answers like
    /// [`super::commit::commit`].
    pub async fn commit(
        &self,
        stream: &str,
        messages: Vec<BatchMessage>,
    ) -> Result<u64, ClaimError> {
        if messages.len() < 2 {
            // A lone record is not a batch: nothing to share.
            return commit_prepared(&self.js, &messages).await;
        }
        let stopped =
            || ClaimError::Unavailable("fenced commit: the stream's committer stopped".into());
        let (done, answer) = oneshot::channel();
        self.queue(stream)
            .send(Member { messages, done })
            .map_err(|_| stopped())?;
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// The queue of `stream`'s committer, started if there is none.
    fn queue(&self, stream: &str) -> mpsc::UnboundedSender<Member> {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        // A committer that stopped (it never should) is replaced, not left refusing.
        if let Some(queue) = streams.get(stream).filter(|q| !q.is_closed()) {
            return queue.clone();
        }
        let (queue, members) = mpsc::unbounded_channel();
        tokio::spawn(run(
            (self.js.clone(), stream.to_string()),
            self.series.clone(),
            members,
        ));
        streams.insert(stream.to_string(), queue.clone());
        queue
    }
}

/// One stream's committer: sends every waiting commit that fits as one batch, waits for its
/// answer, and starts again with what arrived meanwhile; it ends when the host's
/// [`GroupCommits`] is dropped.
async fn run(
    (js, stream): (Context, String),
    series: BatchSeries,
    mut members: mpsc::UnboundedReceiver<Member>,
) {
    let mut carried: Option<Member> = None;
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
        send_group(&js, group, |commits, result| {
            series.batch(&stream, commits, result)
        })
        .await;
    }
}

/// Sends `group` as one batch, tells `ended` how many commits it held and how it ended, then
/// answers each member (so the series are counted before anything the answers lead to).
async fn send_group(js: &Context, group: Vec<Member>, ended: impl FnOnce(usize, BatchResult)) {
    let (commits, answers): (Vec<_>, Vec<_>) = group
        .into_iter()
        .map(|member| (member.messages, member.done))
        .unzip();
    let (result, outcomes) = commit_group(js, commits).await;
    ended(answers.len(), result);
    for (outcome, done) in outcomes.into_iter().zip(answers) {
        let _ = done.send(outcome);
    }
}

/// Sends several commits (each from [`super::commit::prepare`]) as one batch and answers
/// each as [`super::commit::commit`] would have: its record's sequence, a conflict for a
/// stale owner (whose outputs were not stored), or unavailable when there was no answer.
/// Also says how the batch itself ended.
pub async fn commit_group(
    js: &Context,
    mut commits: Vec<Vec<BatchMessage>>,
) -> (BatchResult, Vec<Result<u64, ClaimError>>) {
    if commits.len() == 1 {
        let answer = commit_prepared(js, &commits[0]).await;
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
    match send_batch(js, &messages).await {
        Ok(last) => {
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
        Err(Failure::Refused(e)) => {
            tracing::debug!(
                commits = ends.len(),
                "fenced group refused, committing each alone: {e}"
            );
            let mut rest = messages.into_iter();
            let mut start = 0;
            let alone = ends.into_iter().map(|end| {
                let own: Vec<BatchMessage> = rest.by_ref().take(end - start).collect();
                start = end;
                async move { commit_prepared(js, &own).await }
            });
            // Built in order (each takes its own messages from `rest`), then sent at once.
            let alone: Vec<_> = alone.collect();
            (BatchResult::Refused, futures::future::join_all(alone).await)
        }
        Err(e) => {
            let e = e.to_string();
            let answers = ends
                .iter()
                .map(|_| Err(ClaimError::Unavailable(e.clone())))
                .collect();
            (BatchResult::Unanswered, answers)
        }
    }
}
