//! Group commit over JetStream: the host's adapter of [`dedup_delivery::group`] (which
//! decides how a batch of several messages' fenced commits is laid out and answered, and runs
//! one stream's committer), and the host's committers, one task per fenced stream.

use std::time::Duration;

use async_nats::jetstream::Context;
use dedup_delivery::group::{self, Batches, Committers, Sent};

use super::commit::{commit_prepared, send_batch, BatchMessage, Failure};
use crate::claim::ClaimError;
use crate::metrics::{BatchResult, BatchSeries};

pub use group::MAX_GROUP_MESSAGES;

/// One fenced stream's batches, sent over JetStream.
pub struct JetStreamBatches(pub Context);

impl Batches for JetStreamBatches {
    type Message = BatchMessage;

    async fn send(&self, messages: &[BatchMessage]) -> Sent {
        match send_batch(&self.0, messages).await {
            Ok(last) => Sent::Stored(last),
            Err(Failure::Refused(e)) => Sent::Refused(e.to_string()),
            Err(e) => Sent::Unanswered(e.to_string()),
        }
    }

    async fn commit_alone(&self, messages: &[BatchMessage]) -> Result<u64, ClaimError> {
        commit_prepared(&self.0, messages).await
    }
}

/// The group committers of one host, one per fenced stream, started at first use: the host's
/// [`group::Committers`], each committer a task of its own.
pub struct GroupCommits {
    js: Context,
    series: BatchSeries,
    committers: Committers<BatchMessage>,
}

impl GroupCommits {
    /// Committers sending through `js`, counting their batches in `series`.
    pub fn new(js: Context, series: BatchSeries) -> Self {
        Self {
            js,
            series,
            committers: Committers::default(),
        }
    }

    /// Commits `messages` (one commit's, from [`super::commit::prepare`]) to fenced stream
    /// `stream`, in a batch with whatever else of that stream is waiting
    /// ([`Committers::commit`]: a lone record is sent at once; a queued one is not sent once
    /// its lease's `left` time ran out). Answers like [`super::commit::commit`].
    pub async fn commit(
        &self,
        stream: &str,
        messages: Vec<BatchMessage>,
        left: Duration,
    ) -> Result<u64, ClaimError> {
        let batches = JetStreamBatches(self.js.clone());
        let start = |members| {
            let (series, name) = (self.series.clone(), stream.to_string());
            tokio::spawn(group::run(
                JetStreamBatches(self.js.clone()),
                members,
                move |commits, result| series.batch(&name, commits, result),
            ));
        };
        (self.committers)
            .commit(&batches, stream, messages, left, start)
            .await
    }
}

/// Sends several commits (each from [`super::commit::prepare`]) as one batch over `js` and
/// answers each as [`super::commit::commit`] would have ([`group::commit_group`]). Also says
/// how the batch itself ended.
pub async fn commit_group(
    js: &Context,
    commits: Vec<Vec<BatchMessage>>,
) -> (BatchResult, Vec<Result<u64, ClaimError>>) {
    group::commit_group(&JetStreamBatches(js.clone()), commits).await
}
