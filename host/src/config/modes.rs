//! Per-stream and per-route modes that change what the host creates on the server.

use serde::{Deserialize, Serialize};

/// How a stream refuses a repeated message.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum DedupMode {
    /// A repeated `Nats-Msg-Id` is refused inside the stream's duplicate window only.
    #[default]
    Window,
    /// A stream that admits one message per subject and refuses the next for as long as the
    /// first is kept (discard new per subject, nats-server 2.9+): the event's identity is
    /// its subject, and a repeat is refused at any later time within the stream's retention.
    Forever,
}

/// How a route's outputs are made to take effect once (docs/src/how/fenced.md).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum EffectsMode {
    /// Outputs carry deterministic `Nats-Msg-Id`s and a re-run's copies are dropped by the
    /// receiving stream, inside its duplicate window (which must outlast a re-run). Works
    /// with any stream, including ones the host does not own.
    #[default]
    Window,
    /// On a route: its outputs and its completed claim record are committed as one atomic
    /// batch to the fenced output stream that captures them, and the server refuses the
    /// batch if the claim moved (a stale owner): no window plays a part. On an output
    /// stream: the stream accepts such batches and holds the claim records of the routes
    /// fenced on it (nats-server 2.12+).
    Fenced,
}

/// When a route claims a message's key (DESIGN.md §2, cost model).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum ClaimMode {
    /// Claim under a lease before running, heartbeat while running, record completion after
    /// publishing: for expensive work (OCR, model calls) that must not run twice at once.
    #[default]
    Before,
    /// Run first, publish the outputs with their message ids, then create the key as
    /// completed: one write, no lease, no heartbeat. Two hosts may run one message at the
    /// same time (only wasteful: guests have no other effects); the output stream's window
    /// drops the loser's outputs. For cheap, pure handlers with a short deadline.
    After,
}

/// How a message is acked once its outcome is recorded (DESIGN.md rule 7).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum AckMode {
    /// A plain ack, sent without waiting for the server. The outcome is recorded before it,
    /// so an ack lost on the way costs one redelivery after `ack_wait`, which the claim
    /// answers without running the guest; shutdown and drain flush the connection.
    #[default]
    Plain,
    /// An ack the server confirms (one round trip per message): a lost ack is seen at once
    /// and no redelivery follows, for users who would rather pay the round trip than a
    /// redelivery.
    Confirmed,
}
