//! Values derived from a configuration: backoff per attempt, the duplicate-window rule,
//! long-running lanes and the host-wide instance pool's size.

use std::time::Duration;

use super::Config;
use crate::runtime::engine::PoolTotals;

/// The most slots of the host-wide instance pool (guests alive at once in the pool), unless
/// one route's share is larger: past it, guests are instantiated on demand. Far more than two
/// cores run at once, and small enough that the pool's address space stays well inside
/// x86-64's 128 TB at default limits (256 slots x 8 memories x (64 MiB + 32 MiB guard): 192 GiB).
pub const POOL_MAX_SLOTS: u64 = crate::runtime::engine::DEFAULT_MAX_INSTANCES as u64;

/// What [`Config::longest_rerun_gap`] adds up, as error messages name it.
pub const RERUN_GAP_TERMS: &str = "largest route limits.wall (default 3 x limits.deadline) + lease + clock_skew + largest backoff (source.backoff, or the 5-minute outage backoff when longer) + ack_wait + claims.pause_margin";

/// The longest nak delay after infrastructure errors (a claim store or output stream that
/// does not answer, DESIGN.md rule 20). A message whose first outputs were published before
/// another output's stream failed runs again this long after, at most: every window that
/// protects its outputs must outlast it.
pub use dedup_delivery::backoff::OUTAGE_BACKOFF_MAX;

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

    /// The host-wide instance pool that routes share: one slot per guest that may run at
    /// once (each route's concurrency plus one trial instantiation of a new version), at most
    /// [`POOL_MAX_SLOTS`] (or one route's whole share when that is more), each slot with room
    /// for the largest per-invocation limits configured, and its memories reserved for the
    /// largest `limits.memory_bytes` any route allows. Address space then grows with the pool,
    /// not with routes × concurrency × memories (40 routes with a share each asked for 90 TB of
    /// x86-64's 128 TB); an invocation that finds the pool full is instantiated on demand.
    pub fn pool(&self) -> PoolTotals {
        let share = |r: &super::RouteConfig| r.concurrency(&self.host) as u64 + 1;
        let wanted: u64 = self.routes.iter().map(share).sum();
        let largest = self.routes.iter().map(share).max().unwrap_or(1);
        let slots = wanted.min(POOL_MAX_SLOTS.max(largest)).max(1);
        let slots = u32::try_from(slots).unwrap_or(u32::MAX);
        let most = |f: fn(&crate::limits::Limits) -> usize| {
            let n = self.routes.iter().map(|r| f(&r.limits)).max().unwrap_or(1);
            u32::try_from(n.max(1)).unwrap_or(u32::MAX)
        };
        let (instances, memories, tables) = (
            most(|l| l.instances),
            most(|l| l.memories),
            most(|l| l.tables),
        );
        let memory_bytes = self
            .routes
            .iter()
            .map(|r| r.limits.memory_bytes)
            .max()
            .unwrap_or(crate::limits::DEFAULT_MEMORY_BYTES);
        PoolTotals {
            component_instances: slots,
            core_instances: slots.saturating_mul(instances),
            memories: slots.saturating_mul(memories),
            tables: slots.saturating_mul(tables),
            per_component: (instances, memories, tables),
            memory_bytes,
        }
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
            + self.largest_backoff()
            + self.source.ack_wait
            + self.claims.pause_margin
    }

    /// The largest nak delay of a run that may have published: the largest backoff, or the
    /// outage backoff's ceiling when longer (issue 42, finding 9). Without the outage backoff
    /// only with [`Fix::WindowCoversOutage`] reverted (test-only).
    ///
    /// [`Fix::WindowCoversOutage`]: dedup_delivery::revert::Fix::WindowCoversOutage
    fn largest_backoff(&self) -> Duration {
        match dedup_delivery::revert::reverted(dedup_delivery::revert::Fix::WindowCoversOutage) {
            true => self.max_backoff(),
            false => self.max_backoff().max(OUTAGE_BACKOFF_MAX),
        }
    }

    /// What the dead-letter stream's duplicate window must exceed: a letter is repeated only
    /// by the run after a lapsed lease or a backoff.
    pub fn dead_letter_gap(&self) -> Duration {
        self.claims.lease + self.claims.clock_skew + self.max_backoff()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::runtime::engine::{memory_reservation, MEMORY_GUARD_BYTES};

    /// A config with `n` routes at default settings.
    fn routes(n: usize, extra: &str) -> Config {
        let mut text = String::from(
            "[nats]\nurls = [\"nats://127.0.0.1:4222\"]\n[source]\nsubjects = [\"in.>\"]\n",
        );
        for i in 0..n {
            text += &format!("[[routes]]\nname = \"r{i}\"\nsubject = \"in.r{i}\"\n{extra}");
        }
        Config::parse(&text, Path::new("t.toml"), std::env::temp_dir()).expect("valid")
    }

    #[test]
    fn the_pool_is_shared_by_routes_and_sized_from_configured_limits() {
        let one = routes(1, "").pool();
        // One route keeps its whole share: concurrency 64 plus a trial instantiation.
        assert_eq!(one.component_instances, 65);
        assert_eq!(one.memory_bytes, crate::limits::DEFAULT_MEMORY_BYTES);
        assert_eq!(memory_reservation(one.memory_bytes), 64 << 20);
        for n in [40, 500, 1000] {
            let pool = routes(n, "").pool();
            assert_eq!(
                pool.component_instances as u64, POOL_MAX_SLOTS,
                "{n} routes"
            );
            assert_eq!(pool.memories, pool.component_instances * 8, "{n} routes");
            // 256 slots x 8 memories x (64 MiB + 32 MiB guard): 192 GiB, whatever the routes.
            assert_eq!(
                pool.reserved_bytes(),
                2048 * ((64 << 20) + MEMORY_GUARD_BYTES)
            );
            assert!(pool.reserved_bytes() < 1 << 40, "{n} routes: {pool:?}");
        }
    }

    #[test]
    fn the_largest_route_sets_the_slot_memory_and_a_big_route_keeps_its_share() {
        let mut config = routes(3, "");
        config.routes[1].limits.memory_bytes = 100 << 20;
        config.routes[2].concurrency = Some(1000);
        let pool = config.pool();
        assert_eq!(pool.memory_bytes, 100 << 20);
        assert_eq!(memory_reservation(pool.memory_bytes), 128 << 20);
        assert_eq!(pool.component_instances, 1001);
    }
}
