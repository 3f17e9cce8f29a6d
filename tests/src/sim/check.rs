//! The invariants checked once a run has settled (those checked as it runs are raised by
//! [`super::settle`]): every key ends as its handler deserves, each of its outputs is stored once,
//! each entity's newest message ran, and a message skipped for a newer one was followed by a run.

use dedup_host::claim::record::COALESCED_REASON;
use dedup_host::claim::ClaimState::{Completed, Failed, InProgress};
use dedup_host::config::EffectsMode;

use super::handler::Handler;
use super::host::{space, Hosts};
use super::world::World;

/// The server's default delivery bound (`source.server_max_deliver`); runs drawn with a low
/// bound reach it by design.
const DEFAULT_SERVER_BOUND: u64 = 100;

/// Every broken invariant of the run that ended in `w`.
pub fn end(w: &World, sim: &Hosts, max_deliver: u32) -> Vec<String> {
    let mut out = w.violations.clone();
    out.extend(sim.changed_keys(w));
    let space = space(w);
    // The route's effects under its final contract (a contract change may have turned them).
    let ends_fenced = (w.contract.record.as_ref())
        .map_or(sim.fenced(), |r| r.contract.effects == EffectsMode::Fenced);
    // At the server's default bound no message spends its deliveries in these runs: the
    // outage backoff and the busy delay space its retries past the longest fault. A message
    // the server gave up on here was retried too often (the sweep letters it, which the
    // checks below excuse).
    if w.streams.server_max_deliver >= DEFAULT_SERVER_BOUND {
        for key in &w.gave_up {
            out.push(format!(
                "the server gave up on {key} after {} deliveries: its retries came too often (no delay spaces them past the faults)",
                w.streams.server_max_deliver
            ));
        }
    }
    let source = &w.streams.source;
    let mut keys: Vec<&str> = source.iter().map(|m| m.key.as_str()).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        let replayed = w.replayed.contains(key);
        let fails = !replayed
            && matches!(
                sim.handler(key),
                Handler::Fails(u32::MAX, _) | Handler::Oversized(_)
            );
        // Attempts a pause or a kill may legitimately have cost (each can lose a lease).
        let disrupted = w.disrupted.get(key).copied().unwrap_or(0);
        let failures = match sim.handler(key) {
            Handler::Fails(n, _) => n,
            Handler::Oversized(_) => u32::MAX,
        };
        let failures = if replayed { 0 } else { failures };
        let excused = failures.saturating_add(disrupted) >= max_deliver
            || (w.names.iter()).any(|name| w.gave_up.contains(&format!("{space}{name}{key}")));
        // A coalescing route may complete a key without running it, unless its entity's
        // newest message carries it: that one must run.
        let entity = source
            .iter()
            .find(|m| m.key == key)
            .map(|m| m.entity.as_str());
        let newest = source
            .iter()
            .rev()
            .find(|m| Some(m.entity.as_str()) == entity);
        // Nor unless a later message of its entity ran, or was dead-lettered (its replay
        // runs the newest state): one skipped behind a newer message that never runs (its key
        // already settled: a duplicate) is run by neither (issue 42, finding 6).
        let last = source
            .iter()
            .filter(|m| m.key == key)
            .map(|m| m.sequence)
            .max();
        let lettered_later = source.iter().any(|m| {
            Some(m.entity.as_str()) == entity
                && Some(m.sequence) > last
                && w.dead_letters.contains(&m.key)
        });
        let ran_later = entity.is_some_and(|e| w.started.get(e).copied() > last);
        let covered = ran_later || lettered_later;
        let must_run = !sim.coalesces() || newest.is_some_and(|m| m.key == key) || !covered;
        let record = w.record(&w.claim_key(space, key)).map(|(r, _)| r);
        // A key whose effects a version now gone began is dead-lettered, never finished by
        // another version (issue 42, finding 8); its outputs stay as that version left them.
        let excused = excused || w.components.pinned_gone(record);
        out.extend(w.components.check(key, record));
        // Any later delivery may reclaim a coalesced key, a stale one too (its host paused
        // past the ack wait, its message since acked); if that delivery's own coalesce write
        // goes unanswered, the key ends in progress, still marked coalesced, with no message
        // left to run it: its next message reclaims it once the lease lapses.
        let coalesced = record.is_some_and(|r| {
            r.is_coalesced()
                || (r.state == InProgress && r.reason.as_deref() == Some(COALESCED_REASON))
        });
        let state = record.map(|r| (r.state, r.permanent));
        match (fails, state) {
            (_, Some((Completed | InProgress, _))) if coalesced && !must_run => {}
            (false, Some((Completed, _))) if !coalesced => {}
            (true, Some((Failed, true))) => {}
            (false, Some((Failed, true))) if excused => {}
            (_, state) => out.push(format!(
                "key {key} ended {state:?}{} (its handler {}{})",
                if coalesced { " coalesced" } else { "" },
                if fails { "fails" } else { "does not fail" },
                if must_run { ", and it must run" } else { "" }
            )),
        }
        // Each output by its index: a window route's publish may fail part-way, storing one
        // output and not the next; an oversized key stores none of its outputs. A renamed
        // route's are counted under every name it had (each name gives other ids).
        for index in 0..sim.handler(key).outputs() {
            let copies: usize = (w.names.iter())
                .map(|name| (w.outputs.get(&format!("{name}{key}#{index}"))).map_or(0, Vec::len))
                .sum();
            match (fails, copies) {
                (false, 1) | (true, 0) => {}
                (false, 0) if excused || (coalesced && !must_run) => {}
                // A run that published but could not record it before its attempts ran out
                // (a lease lost to faults) is dead-lettered; a window route's replay long
                // after publishes again, past the window: the limit of window effects. The
                // route is window if it started so or if `setup --change-route` made it so
                // (the replay runs under the final contract; seed 17265 `--fenced`); a route
                // fenced from start to end stores each output once, replayed or not.
                (false, 2) if replayed && !(sim.fenced() && ends_fenced) => {}
                (_, n) => out.push(format!("key {key}: its output {index} is stored {n} times")),
            }
        }
        let letters = w.dead_letters.iter().filter(|k| *k == key).count();
        if fails && letters == 0 && (must_run || !coalesced) {
            out.push(format!("key {key} failed for good without a dead letter"));
        }
        if !fails && letters > 0 && !excused && !replayed {
            out.push(format!("key {key} succeeded yet was dead-lettered"));
        }
    }
    out
}
