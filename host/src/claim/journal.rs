//! Where a run's outbound calls are journaled ([`dedup_delivery::journal`]): beside its claim,
//! in the store that holds the claim (the claim bucket, or a fenced route's stream), on
//! subjects `<claim subject>.call.<index>`. Every write is fenced by the claim: it carries
//! `Nats-Expected-Last-Subject-Sequence` on the claim's subject, set to a revision of the
//! claim that is this run's (in progress, with this run's fencing token), so the server
//! refuses it if anybody wrote the claim since: a stale owner can neither record nor send.
//! That revision is the one the run's lease already holds ([`HeldRevision`], kept current by
//! its heartbeats), so a write needs no read of the claim first; only a refused write reads
//! the claim back, once, to tell the run's own renewal (write again at the new revision) from
//! a takeover ([`JournalError::Fenced`]).

use async_nats::jetstream::stream::{LastRawMessageErrorKind, Stream};
use async_nats::jetstream::Context;
use async_nats::HeaderMap;
use dedup_delivery::claim::HeldRevision;
use dedup_delivery::journal::{CallRecord, CallStore, JournalError, StoreFuture};

use super::kv::is_cas_conflict;
use super::record::{ClaimRecord, ClaimState};
use super::stream::{stream_of, EXPECTED_LAST_SUBJECT_SEQUENCE};
use crate::subject::FENCED_CLAIMS_PREFIX;

/// The header naming the subject whose last sequence `Nats-Expected-Last-Subject-Sequence`
/// checks (nats-server 2.11+).
const EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT: &str = "Nats-Expected-Last-Subject-Sequence-Subject";

/// How many times a write is tried when the claim moved under it (a heartbeat of this very
/// run renewed it).
const CLAIM_MOVES: usize = 5;

/// The stream and claim subject holding the call records of claim `store_key` (a key of
/// bucket `bucket`, or a fenced claim subject); records are on `<claim subject>.call.<index>`.
pub fn place(bucket: &str, store_key: &str) -> (String, String) {
    match store_key.starts_with(FENCED_CLAIMS_PREFIX) {
        true => (
            stream_of(store_key).unwrap_or_default().to_string(),
            store_key.to_string(),
        ),
        false => (format!("KV_{bucket}"), format!("$KV.{bucket}.{store_key}")),
    }
}

/// One run's journal in NATS, fenced by its claim.
pub struct NatsCallStore {
    js: Context,
    stream: String,
    claim_subject: String,
    fencing_token: u64,
    /// The claim's revision as the run's lease holds it; none: read the claim before writing.
    held: Option<HeldRevision>,
}

impl NatsCallStore {
    /// The journal of the run holding claim `store_key` (a key of bucket `bucket`, or a
    /// fenced claim subject) with `fencing_token`. Each write reads the claim first; a run
    /// whose lease tracks the claim's revision says so with [`NatsCallStore::held_at`].
    pub fn for_claim(js: &Context, bucket: &str, store_key: &str, fencing_token: u64) -> Self {
        let (stream, claim_subject) = place(bucket, store_key);
        Self {
            js: js.clone(),
            stream,
            claim_subject,
            fencing_token,
            held: None,
        }
    }

    /// The same journal, its writes fenced by `held`, the revision the run's lease holds
    /// (`Lease::held_revision`): no read of the claim before a write while the lease holds
    /// one.
    pub fn held_at(mut self, held: HeldRevision) -> Self {
        self.held = Some(held);
        self
    }

    fn subject_of(&self, index: u32) -> String {
        format!("{}.call.{index}", self.claim_subject)
    }

    async fn stream(&self) -> Result<Stream<()>, JournalError> {
        (self.js)
            .get_stream_no_info(&self.stream)
            .await
            .map_err(|e| JournalError::Unavailable(e.to_string()))
    }

    /// The last message of `subject` (payload, sequence), read from the stream's leader.
    async fn last(&self, subject: &str) -> Result<Option<(bytes::Bytes, u64)>, JournalError> {
        let stream = self.stream().await?;
        match stream.get_last_raw_message_by_subject(subject).await {
            Ok(m) if m.headers.get("KV-Operation").is_some() => Ok(None),
            Ok(m) => Ok(Some((m.payload, m.sequence))),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(JournalError::Unavailable(e.to_string())),
        }
    }

    /// The claim's revision while it is still this run's; [`JournalError::Fenced`] otherwise.
    async fn own_revision(&self) -> Result<u64, JournalError> {
        let (payload, revision) = self
            .last(&self.claim_subject)
            .await?
            .ok_or(JournalError::Fenced)?;
        let record = ClaimRecord::from_bytes(&payload).map_err(|_| JournalError::Fenced)?;
        // The record of the winning write carries no token yet: its revision is the token.
        let ours = record.state == ClaimState::InProgress
            && (record.fencing_token == Some(self.fencing_token) || revision == self.fencing_token);
        match ours {
            true => Ok(revision),
            false => Err(JournalError::Fenced),
        }
    }

    /// The revision the run's lease holds, if it holds one.
    fn held(&self) -> Option<u64> {
        self.held.as_ref().and_then(HeldRevision::get)
    }

    async fn put(&self, record: CallRecord) -> Result<(), JournalError> {
        let subject = self.subject_of(record.index);
        let record = CallRecord {
            token: Some(self.fencing_token),
            ..record
        };
        let payload = record.to_bytes();
        // The revision to fence with: the lease's, else one read from the claim.
        let mut known = self.held();
        for _ in 0..CLAIM_MOVES {
            let revision = match known {
                Some(revision) => revision,
                None => self.own_revision().await?,
            };
            let mut headers = HeaderMap::new();
            headers.insert(
                EXPECTED_LAST_SUBJECT_SEQUENCE,
                revision.to_string().as_str(),
            );
            headers.insert(
                EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT,
                self.claim_subject.as_str(),
            );
            let sent = (self.js)
                .publish_with_headers(subject.clone(), headers, payload.clone().into())
                .await
                .map_err(|e| JournalError::Unavailable(e.to_string()))?;
            match sent.await {
                Ok(_) => return Ok(()),
                Err(e) if is_cas_conflict(&e) => {
                    // The claim moved past `revision`. A later write of the lease's own (a
                    // heartbeat that landed meanwhile) is fenced by its revision as well;
                    // otherwise the claim is read back: still ours at a later revision (a
                    // renewal whose answer the lease has not seen yet), or taken over.
                    known = self.held().filter(|held| *held != revision);
                }
                Err(e) => return Err(JournalError::Unavailable(e.to_string())),
            }
        }
        Err(JournalError::Unavailable(format!(
            "the claim moved under every one of {CLAIM_MOVES} tries to record the call"
        )))
    }
}

impl CallStore for NatsCallStore {
    fn read(&self, index: u32) -> StoreFuture<'_, Option<CallRecord>> {
        Box::pin(async move {
            let Some((payload, _)) = self.last(&self.subject_of(index)).await? else {
                return Ok(None);
            };
            let record = CallRecord::from_bytes(&payload).map_err(|e| JournalError::Corrupt {
                index,
                message: e.to_string(),
            })?;
            Ok(Some(record))
        })
    }

    fn write(&self, record: CallRecord) -> StoreFuture<'_, ()> {
        Box::pin(self.put(record))
    }
}
