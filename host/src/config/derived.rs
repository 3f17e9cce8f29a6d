//! Values derived from a configuration: backoff per attempt, the duplicate-window rule,
//! long-running lanes and the instance pool's per-route shares.

use std::time::Duration;

use super::Config;
use crate::runtime::engine::PoolTotals;

/// What [`Config::longest_rerun_gap`] adds up, as error messages name it.
pub const RERUN_GAP_TERMS: &str = "largest route limits.wall (default 3 x limits.deadline) + lease + clock_skew + largest backoff (source.backoff, or the 5-minute outage backoff when longer) + ack_wait + claims.pause_margin";

/// The longest nak delay after infrastructure errors (a claim store or output stream that
/// does not answer, DESIGN.md rule 20). A message whose first outputs were published before
/// another output's stream failed runs again this long after, at most: every window that
/// protects its outputs must outlast it.
pub const OUTAGE_BACKOFF_MAX: Duration = Duration::from_secs(300);

impl Config {
    /// The nak delay after failed attempt number `attempt` (1-based).
    pub fn backoff_for(&self, attempt: u32) -> Duration {
        let backoff = &self.source.backoff;
        let i = (attempt.max(1) as usize - 1).min(backoff.len().saturating_sub(1));
        backoff.get(i).copied().unwrap_or(Duration::from_secs(1))
    }

    /// The process's long-running lanes: `host.long_running_lanes`, or half the cores.
    pub fn lanes(&self) -> usize {
        self.host
            .long_running_lanes
            .unwrap_or_else(crate::runtime::engine::default_lanes)
    }

    /// How many long-running lanes one route may hold at once: all but one per other route,
    /// so with enough lanes every route always finds one free; with fewer lanes than routes,
    /// one each, and the process's lanes are handed out first come, first served.
    pub fn route_lanes(&self) -> usize {
        let others = self.routes.len().saturating_sub(1);
        self.lanes().saturating_sub(others).max(1)
    }

    /// The instance pool: every route's share (its concurrency, plus one trial instantiation
    /// of a new version, times its limits), so no route can take room a neighbour needs.
    pub fn pool(&self) -> PoolTotals {
        let mut pool = PoolTotals {
            component_instances: 0,
            core_instances: 0,
            memories: 0,
            tables: 0,
            per_component: (1, 1, 1),
        };
        for r in &self.routes {
            let l = &r.limits;
            pool.add_share(
                r.concurrency(&self.host) as u32 + 1,
                l.instances as u32,
                l.memories as u32,
                l.tables as u32,
            );
        }
        pool
    }

    /// The largest configured backoff: a guest's requested retry delay is clamped to it.
    pub fn max_backoff(&self) -> Duration {
        self.source
            .backoff
            .iter()
            .max()
            .copied()
            .unwrap_or(Duration::from_secs(1))
    }

    /// The longest time between two runs of one key that publish outputs ([`RERUN_GAP_TERMS`]): the longest
    /// route wall-clock limit (a run publishes at its end; [`crate::limits::Limits::wall_limit`]), a lease that lapsed plus the clock-skew
    /// margin, the largest backoff (a guest's retry, or [`OUTAGE_BACKOFF_MAX`] after an output
    /// stream failed with earlier outputs published), the ack wait before a redelivery, and
    /// the pause margin for outages and stopped processes. Every stream a route publishes to
    /// must keep message ids longer than this, or a re-run could publish an output twice
    /// (DESIGN.md §2 rule 6).
    pub fn longest_rerun_gap(&self) -> Duration {
        let deadline = self
            .routes
            .iter()
            .map(|r| r.limits.wall_limit())
            .max()
            .unwrap_or_default();
        deadline
            + self.claims.lease
            + self.claims.clock_skew
            + self.max_backoff().max(OUTAGE_BACKOFF_MAX)
            + self.source.ack_wait
            + self.claims.pause_margin
    }

    /// What the dead-letter stream's duplicate window must exceed: a letter is repeated only
    /// by the run after a lapsed lease or a backoff.
    pub fn dead_letter_gap(&self) -> Duration {
        self.claims.lease + self.claims.clock_skew + self.max_backoff()
    }
}
