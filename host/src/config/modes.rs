//! Per-stream and per-route modes that change what the host creates on the server.

use serde::Deserialize;

/// How a stream refuses a repeated message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
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
