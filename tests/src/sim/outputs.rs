//! A run's outputs on their way to the model server. Which headers each output carries (the
//! guest's own, the trace context the producer set on the event and the host carries, the
//! host's `Nats-Msg-Id` or a fenced output's `Dedup-Output-Id`) is the host's choice, made by
//! its own functions ([`effects::prepare_outputs`], [`commit::prepare`]); so is the size check
//! ([`effects::over_max_payload`] over [`effects::fenced_sizes`] or each output's
//! `wire_size`). What the server counts against its `max_payload` is the model's own count
//! ([`hpub_size`]), independent of the host's check: the two must agree, and a publish or a
//! batch member over the limit is refused (`World::publish`, `World::serve_batch`).

use dedup_host::bindings;
use dedup_host::claim::ClaimRecord;
use dedup_host::fenced::commit;
use dedup_host::pipeline::effects;
use dedup_host::telemetry::Trace;

/// An output a run publishes (or a fenced batch carries), as the model server sees it.
#[derive(Debug, Clone)]
pub struct Output {
    /// The id its copies are counted under (`<key>#<index>`).
    pub id: String,
    /// The subject it is published on (every subject is captured by the one output stream).
    pub subject: String,
    /// Its size as nats-server counts it ([`hpub_size`]), which the server refuses above
    /// `max_payload` (in a fenced batch, before the batch headers: the server adds them at
    /// its place).
    pub size: usize,
}

/// The `NATS/1.0\r\n` line and the final `\r\n` of a header block.
pub(super) const BLOCK_FRAMING: usize = "NATS/1.0\r\n".len() + "\r\n".len();

/// The `: ` and `\r\n` of one header line.
pub(super) const LINE_FRAMING: usize = ": ".len() + "\r\n".len();

/// What nats-server counts against its `max_payload` for one HPUB with header `lines` and a
/// payload of `payload` bytes: the whole header block (`NATS/1.0\r\n`, each
/// `Name: Value\r\n`, the final `\r\n`) plus the payload.
pub(super) fn hpub_size<'a>(
    lines: impl IntoIterator<Item = (&'a str, &'a str)>,
    payload: usize,
) -> usize {
    let lines: usize = (lines.into_iter())
        .map(|(name, value)| name.len() + value.len() + LINE_FRAMING)
        .sum();
    BLOCK_FRAMING + lines + payload
}

/// One successful run's outputs as the guest returned them, with the trace context
/// (`traceparent`, `tracestate`) the producer set on the event, which the host carries onto
/// each output (traces off: the host's own send span would replace `traceparent` by one of
/// the same size).
#[derive(Debug, Clone)]
pub struct Outputs {
    /// The guest's outputs, in order.
    pub list: Vec<bindings::Output>,
    /// The event's trace headers.
    pub trace: Vec<(&'static str, String)>,
    /// The handler version that made them (issue 42, finding 8).
    pub version: Version,
}

/// Who made a run's outputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// The handler version's digest.
    pub digest: String,
    /// A shadow run's (compared and thrown away, never stored).
    pub shadow: bool,
}

impl Version {
    /// A run of `digest` that counts (not a shadow's).
    pub fn of(digest: &str) -> Self {
        Self {
            digest: digest.to_string(),
            shadow: false,
        }
    }
}

impl Outputs {
    fn trace(&self) -> Vec<(&str, &str)> {
        self.trace.iter().map(|(n, v)| (*n, v.as_str())).collect()
    }

    /// Why the host's own size check finds them unstorable for `claim_key` on a server whose
    /// `max_payload` is `max`, as its window route (`fenced` false) or fenced route checks
    /// them.
    pub fn oversized(&self, claim_key: &str, fenced: bool, max: usize) -> Option<String> {
        let trace = self.trace();
        if fenced {
            let sizes = effects::fenced_sizes(claim_key, &self.list, &trace);
            return effects::over_max_payload(max, claim_key, sizes);
        }
        let outgoing = effects::prepare_outputs(claim_key, &self.list, &Trace::default(), &trace);
        let sizes = outgoing.iter().map(|o| (o.subject(), o.wire_size()));
        effects::over_max_payload(max, claim_key, sizes)
    }

    /// Each output's header block as a window route publishes it for `claim_key`: its bytes
    /// on the wire and its number of lines.
    pub fn blocks(&self, claim_key: &str) -> Vec<(usize, usize)> {
        let trace = self.trace();
        let outgoing = effects::prepare_outputs(claim_key, &self.list, &Trace::default(), &trace);
        (outgoing.iter())
            .map(|o| (hpub_size(o.header_lines(), 0), o.header_lines().count()))
            .collect()
    }

    /// As a window route publishes them for `claim_key`: each its own HPUB.
    pub fn published(&self, claim_key: &str) -> Vec<Output> {
        let blocks = self.blocks(claim_key);
        (self.list.iter().zip(blocks).enumerate())
            .map(|(i, (o, (block, _)))| Output {
                id: dedup_delivery::claim::key::output_id(claim_key, i),
                subject: o.subject.clone(),
                size: block + o.payload.len(),
            })
            .collect()
    }

    /// As a fenced commit of `record` at `revision` lays them out for `claim_key`
    /// ([`commit::prepare`]): each output, and the size of the record sent after them, each
    /// sized as nats-server counts it before the batch headers, which the model server adds
    /// at each message's place in the batch it ends up in (`world::batch`).
    pub fn committed(
        &self,
        claim_key: &str,
        record: &ClaimRecord,
        revision: u64,
    ) -> (Vec<Output>, usize) {
        let trace = self.trace();
        let keys = (claim_key, claim_key);
        let messages = commit::prepare(keys, record, revision, &self.list, &trace);
        let size = |m: &commit::BatchMessage| hpub_size(m.header_lines(), m.payload_len());
        let (last, outputs) = messages
            .split_last()
            .expect("a commit ends with its record");
        let outputs = (outputs.iter().enumerate())
            .map(|(i, m)| Output {
                id: format!("{claim_key}#{i}"),
                subject: m.subject().to_string(),
                size: size(m),
            })
            .collect();
        (outputs, size(last))
    }
}
