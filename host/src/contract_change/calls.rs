//! Moving a claim's journal of outbound calls (DESIGN.md rule 24) with its claim record: the
//! records on `<claim subject>.call.<index>` ([`crate::claim::journal`]) are copied, byte for
//! byte, to the claim's subjects in the new place, so a key that runs again after the move
//! (still retrying, or its dead letter replayed) replays its recorded answers instead of
//! sending its calls again. Like the claim records, the journal is read in full before
//! anything is written ([`plan`]), and each write expects the last sequence read on its
//! subject in the new place, so a record written there in between stops the move instead of
//! being written over. The old place's records are not written meanwhile: the move runs only
//! once no host serves the route (the change's mark and probe), and no run of the key holds
//! its claim.

use std::collections::BTreeMap;

use anyhow::Context as _;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use async_nats::jetstream::Context;
use async_nats::HeaderMap;
use bytes::Bytes;

use super::claims::{store_key, subjects_from_leader};
use crate::claim::stream::EXPECTED_LAST_SUBJECT_SEQUENCE;

/// The header of a deletion marker, which every reader of a journal takes for no record.
const CLEARED_HEADER: &str = "KV-Operation";

/// What a journal's call subject holds: the record (`None`: a deletion marker) and the
/// subject's last sequence.
type Latest = BTreeMap<String, (Option<Bytes>, u64)>;

/// Where the journal of claim key `claim_key` lives in the claim store of `claims`
/// (`bucket <name>` or `stream <name>`): (stream, claim subject).
fn place_of(claims: &str, claim_key: &str) -> (String, String) {
    let bucket = claims.strip_prefix("bucket ").unwrap_or(claims);
    crate::claim::journal::place(bucket, &store_key(claims, claim_key))
}

/// The writes that copy one claim's journal to its new place, worked out before any is done.
#[derive(Debug, Default)]
pub(crate) struct CallsMove {
    writes: Vec<Write>,
}

/// One write of a [`CallsMove`].
#[derive(Debug)]
struct Write {
    subject: String,
    /// The record's bytes; `None` writes a deletion marker.
    payload: Option<Bytes>,
    /// The subject's last sequence when it was read (0: no message).
    expected: u64,
}

impl CallsMove {
    /// How many call records it writes.
    pub(crate) fn len(&self) -> usize {
        self.writes.len()
    }

    /// Does the writes, each refused by the server if its subject changed since [`plan`]
    /// read it.
    pub(crate) async fn apply(&self, js: &Context) -> anyhow::Result<()> {
        for write in &self.writes {
            let mut headers = HeaderMap::new();
            headers.insert(
                EXPECTED_LAST_SUBJECT_SEQUENCE,
                write.expected.to_string().as_str(),
            );
            if write.payload.is_none() {
                headers.insert(CLEARED_HEADER, "DEL");
            }
            let payload = write.payload.clone().unwrap_or_default();
            let written = async {
                js.publish_with_headers(write.subject.clone(), headers, payload)
                    .await?
                    .await?;
                anyhow::Ok(())
            };
            written.await.with_context(|| {
                format!(
                    "copying outbound-call record `{}` (it changed since it was read, or the store did not answer)",
                    write.subject
                )
            })?;
        }
        Ok(())
    }
}

/// One claim's journal that cannot be copied: a record larger than the new place takes.
#[derive(Debug, Clone)]
pub(crate) struct TooLarge {
    /// The claim key.
    pub(crate) key: String,
    /// The largest record's size, in bytes.
    pub(crate) bytes: usize,
}

/// Works out how to copy the journal of claim key `from_key` in the claim store of
/// `from_claims` to claim key `to_key` in that of `to_claims`: each record there, and a
/// deletion marker over each record the new place holds that the old one does not (left by
/// an earlier life of the key there: claims moved A to B to A, or a renamed route's name
/// used before). `max_bytes` is the largest message the new place takes (`None`: any).
pub(crate) async fn plan(
    js: &Context,
    (from_claims, from_key): (&str, &str),
    (to_claims, to_key): (&str, &str),
    max_bytes: Option<usize>,
) -> anyhow::Result<Result<CallsMove, TooLarge>> {
    let (from_stream, from_subject) = place_of(from_claims, from_key);
    let (to_stream, to_subject) = place_of(to_claims, to_key);
    let from = latest(js, &from_stream, &from_subject).await?;
    let there = latest(js, &to_stream, &to_subject).await?;
    let largest = (from.values())
        .filter_map(|(p, _)| p.as_ref().map(Bytes::len))
        .max();
    if let (Some(bytes), Some(max)) = (largest, max_bytes) {
        // The server counts a message's headers too: those a copy carries
        // ([`COPY_HEADER_BYTES`]) must fit beside the record.
        if bytes + COPY_HEADER_BYTES > max {
            return Ok(Err(TooLarge {
                key: from_key.to_string(),
                bytes,
            }));
        }
    }
    let mut writes = Vec::new();
    for (index, (payload, _)) in &from {
        let (held, expected) = there.get(index).cloned().unwrap_or((None, 0));
        if held == *payload {
            continue;
        }
        writes.push(Write {
            subject: format!("{to_subject}.call.{index}"),
            payload: payload.clone(),
            expected,
        });
    }
    // Records the new place kept from an earlier life of the key there: an index the old
    // place never had would otherwise be replayed from them.
    for (index, (held, expected)) in &there {
        if held.is_some() && !from.contains_key(index) {
            writes.push(Write {
                subject: format!("{to_subject}.call.{index}"),
                payload: None,
                expected: *expected,
            });
        }
    }
    Ok(Ok(CallsMove { writes }))
}

/// An upper bound of the header bytes a copied record carries (`NATS/1.0`, and
/// `Nats-Expected-Last-Subject-Sequence` with a 20-digit sequence), which a stream's
/// `max_message_size` counts with the payload.
const COPY_HEADER_BYTES: usize = 128;

/// The largest message stream `stream` takes (`None`: no limit set).
pub(crate) async fn max_bytes(js: &Context, stream: &str) -> anyhow::Result<Option<usize>> {
    let mut s = js
        .get_stream(stream)
        .await
        .with_context(|| format!("cannot open stream `{stream}` to copy call journals into"))?;
    let max = s.info().await?.config.max_message_size;
    Ok(usize::try_from(max).ok().filter(|m| *m > 0))
}

/// The stream holding the journals of the claim store of `claims`.
pub(crate) fn stream_of(claims: &str) -> String {
    match claims.strip_prefix("stream ") {
        Some(stream) => stream.to_string(),
        None => format!("KV_{}", claims.strip_prefix("bucket ").unwrap_or(claims)),
    }
}

/// The latest message of each call subject of claim subject `claim_subject` in `stream`,
/// read from the stream's leader, by the subject's index part.
async fn latest(js: &Context, stream: &str, claim_subject: &str) -> anyhow::Result<Latest> {
    let prefix = format!("{claim_subject}.call.");
    let subjects = subjects_from_leader(js, stream, format!("{prefix}*")).await?;
    let mut found = Latest::new();
    if subjects.is_empty() {
        return Ok(found);
    }
    let s = js
        .get_stream_no_info(stream)
        .await
        .with_context(|| format!("cannot open stream `{stream}` to read a call journal"))?;
    for subject in subjects {
        let Some(index) = subject.strip_prefix(&prefix) else {
            continue;
        };
        let m = match s.get_last_raw_message_by_subject(&subject).await {
            Ok(m) => m,
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => continue,
            Err(e) => {
                return Err(anyhow::Error::new(e))
                    .with_context(|| format!("cannot read outbound-call record `{subject}`"))
            }
        };
        let payload = match m.headers.get(CLEARED_HEADER) {
            Some(_) => None,
            None => Some(m.payload),
        };
        found.insert(index.to_string(), (payload, m.sequence));
    }
    Ok(found)
}
