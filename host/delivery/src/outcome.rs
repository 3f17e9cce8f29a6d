//! How a delivery ended and where a repeat was caught: what the delivery logic reports, and
//! the labels of the host's counters.

/// How a message's delivery ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageOutcome {
    /// The handler succeeded; outputs published, completion recorded, acked.
    Processed,
    /// Acked or termed without running: the key was completed or dead-lettered already.
    Duplicate,
    /// Naked because another owner held a live claim.
    Busy,
    /// A failed attempt naked for a later retry.
    Retried,
    /// Published to the dead-letter subject and termed.
    DeadLettered,
    /// The claim was taken over mid-flight; this attempt's work was dropped.
    LostClaim,
    /// An infrastructure error (NATS unavailable, a publish failed) that led to a nak.
    Error,
    /// Completed without running: a newer message of its entity was waiting (`coalesce`).
    Coalesced,
}

impl MessageOutcome {
    /// Every outcome, in label order.
    pub const ALL: [MessageOutcome; 8] = [
        Self::Processed,
        Self::Duplicate,
        Self::Busy,
        Self::Retried,
        Self::DeadLettered,
        Self::LostClaim,
        Self::Error,
        Self::Coalesced,
    ];

    /// The `outcome` label value.
    pub fn label(self) -> &'static str {
        match self {
            Self::Processed => "processed",
            Self::Duplicate => "duplicate",
            Self::Busy => "busy",
            Self::Retried => "retried",
            Self::DeadLettered => "dead_lettered",
            Self::LostClaim => "lost_claim",
            Self::Error => "error",
            Self::Coalesced => "coalesced",
        }
    }
}

/// Where a repeat was caught.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DedupLayer {
    /// A publish the receiving stream dropped inside its duplicate window.
    Stream,
    /// A delivery whose key was already completed or dead-lettered.
    Claim,
    /// An output the output stream reported as a duplicate.
    Output,
    /// A fenced commit the server refused because the claim had moved to another owner: a
    /// stale owner's whole output set, stopped at the stream.
    Fence,
}

impl DedupLayer {
    /// Every layer, in label order.
    pub const ALL: [DedupLayer; 4] = [Self::Stream, Self::Claim, Self::Output, Self::Fence];

    /// The `layer` label value.
    pub fn label(self) -> &'static str {
        match self {
            Self::Stream => "stream",
            Self::Claim => "claim",
            Self::Output => "output",
            Self::Fence => "fence",
        }
    }
}
