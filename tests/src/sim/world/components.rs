//! The route's versions on the model server (issue 42, finding 8): what the components bucket
//! says (the live version and a candidate, canary or shadow), the operator's or the hosts'
//! decisions under traffic (a candidate deployed, its canary split moved, promoted or rolled
//! back, each a new revision the hosts' watches see after a moment), what each host runs now
//! (its view, which lags the bucket), and which version stored each key's window outputs.
//!
//! The versions of the seeded handler differ only in who made their outputs: each stored copy
//! is counted with its version, so a key finished by a version other than the one that began
//! it, or a shadow run's output stored, shows at once.

use std::collections::{BTreeMap, BTreeSet};

use dedup_host::candidate::Mode as Split;
use dedup_host::claim::{ClaimRecord, ClaimState};

use super::super::outputs::Version;
use super::Rng;

/// The live version every run starts with.
pub const LIVE: &str = "v1";
/// The candidate's version.
pub const CANDIDATE: &str = "v2";

/// A route's versions: its live version and its candidate, if any.
#[derive(Debug, Clone, PartialEq)]
pub struct Versions {
    /// The live version.
    pub live: String,
    /// The candidate and how it runs.
    pub candidate: Option<(String, Split)>,
}

impl Versions {
    /// Whether `digest` is installed: the live version or the candidate (shadow or canary), as
    /// the host's `pipeline::pinned::installed` finds it; on the bucket, whether it is offered.
    pub fn installed(&self, digest: &str) -> bool {
        self.live == digest || self.candidate.as_ref().is_some_and(|(d, _)| d == digest)
    }

    /// As a host serving a claim-after route takes them: a canary refused
    /// ([`dedup_host::candidate::refusal`]; a shadow runs).
    fn served(&self, claim_after: bool) -> Versions {
        let refused = self.candidate.as_ref().is_some_and(|(_, split)| {
            dedup_host::candidate::refusal("r", claim_after, split).is_some()
        });
        match refused {
            true => Versions {
                live: self.live.clone(),
                candidate: None,
            },
            false => self.clone(),
        }
    }
}

/// A change of the route's versions.
#[derive(Debug, Clone)]
enum Change {
    /// The candidate deployed, as a canary or a shadow.
    Deploy(Split),
    /// The canary's share of keys moved.
    Share(u8),
    /// The candidate made the live version.
    Promote,
    /// The candidate removed.
    RollBack,
}

/// The route's versions on the model server, and what each host runs.
#[derive(Debug)]
pub struct Components {
    /// What the components bucket says now.
    pub versions: Versions,
    /// Its revision: one per change.
    pub revision: u64,
    /// Changes still to come, in time order.
    changes: Vec<(u64, Change)>,
    /// What each host runs, and the revision it saw last.
    views: Vec<(Versions, u64)>,
    /// Whether the route claims after running (a canary is refused there).
    claim_after: bool,
    /// The draws of the watches, apart from the other draws.
    rng: Rng,
    /// Per key, the versions that stored one of its window outputs.
    stored: BTreeMap<String, BTreeSet<String>>,
    /// Shadow runs made (their outputs compared and thrown away).
    pub shadow_runs: u64,
}

impl Default for Components {
    fn default() -> Self {
        Self {
            versions: Versions {
                live: LIVE.into(),
                candidate: None,
            },
            revision: 0,
            changes: Vec::new(),
            views: Vec::new(),
            claim_after: false,
            rng: Rng::new(0),
            stored: BTreeMap::new(),
            shadow_runs: 0,
        }
    }
}

impl Components {
    /// The versions of a run of seed `seed` with `hosts` hosts, starting at `epoch`, faults
    /// for `faults_ms`: one run in two deploys a candidate in the first half of the faults (a
    /// canary of 10 to 90 % of keys, or one in four a shadow), moves a canary's share one run
    /// in two, then promotes or rolls it back 2 to 20 s later. Drawn from a generator of its
    /// own, so that runs without a candidate are as before.
    pub fn draw(seed: u64, hosts: usize, claim_after: bool, epoch: u64, faults_ms: u64) -> Self {
        let mut rng = Rng::new(seed.rotate_left(41) ^ 0xCA9A);
        let mut changes = Vec::new();
        if rng.chance(500) {
            let mut at = epoch + rng.range(0, faults_ms / 2);
            let split = match rng.chance(250) {
                true => Split::Shadow { secondary: false },
                false => Split::Canary {
                    percent: rng.range(10, 90) as u8,
                },
            };
            let canary = matches!(split, Split::Canary { .. });
            changes.push((at, Change::Deploy(split)));
            if canary && rng.chance(500) {
                at += rng.range(1_000, 10_000);
                changes.push((at, Change::Share(rng.range(1, 99) as u8)));
            }
            at += rng.range(2_000, 20_000);
            let end = match rng.chance(500) {
                true => Change::Promote,
                false => Change::RollBack,
            };
            changes.push((at, end));
        }
        let versions = Components::default().versions;
        Self {
            views: vec![(versions.clone(), 0); hosts],
            versions,
            changes,
            claim_after,
            rng,
            ..Default::default()
        }
    }

    /// When the next change comes, if one is still to come.
    pub fn next_event(&self) -> Option<u64> {
        self.changes.first().map(|(at, _)| *at)
    }

    /// Applies the changes due at `now` to the bucket; returns a line for each.
    pub fn due(&mut self, now: u64) -> Vec<String> {
        let mut lines = Vec::new();
        while self.changes.first().is_some_and(|(at, _)| *at <= now) {
            let (_, change) = self.changes.remove(0);
            let v = &mut self.versions;
            match &change {
                Change::Deploy(split) => v.candidate = Some((CANDIDATE.into(), split.clone())),
                Change::Share(percent) => {
                    if let Some((_, split)) = &mut v.candidate {
                        *split = Split::Canary { percent: *percent };
                    }
                }
                Change::Promote => {
                    if let Some((digest, _)) = v.candidate.take() {
                        v.live = digest;
                    }
                }
                Change::RollBack => v.candidate = None,
            }
            self.revision += 1;
            lines.push(format!(
                "components: {change:?} (revision {}): {:?}",
                self.revision, self.versions
            ));
        }
        lines
    }

    /// What host `host` runs now (the bucket's versions if it has no view yet).
    pub fn view(&self, host: usize) -> &Versions {
        self.views.get(host).map_or(&self.versions, |(v, _)| v)
    }

    /// Host `host`'s watch of the bucket, polled once while it runs and reaches the server:
    /// sees a newer revision now and then (after a moment, as a host notices and loads a new
    /// version); returns a line when it does.
    pub fn watch(&mut self, host: usize) -> Option<String> {
        let (revision, claim_after) = (self.revision, self.claim_after);
        let seen = self.views.get(host)?.1;
        if seen >= revision || !self.rng.chance(300) {
            return None;
        }
        let served = self.versions.served(claim_after);
        let line = format!("h{host} loads revision {revision} of the components: {served:?}");
        self.views[host] = (served, revision);
        Some(line)
    }

    /// Host `host` restarted: it loads what the bucket says now.
    pub fn restarted(&mut self, host: usize) {
        let served = self.versions.served(self.claim_after);
        if let Some(view) = self.views.get_mut(host) {
            *view = (served, self.revision);
        }
    }

    /// A copy of `key`'s output made by `by` was stored; a violation if a shadow run made it.
    pub fn stored(&mut self, key: &str, id: &str, by: &Version) -> Option<String> {
        self.stored
            .entry(key.to_string())
            .or_default()
            .insert(by.digest.clone());
        by.shadow.then(|| {
            format!(
                "{id}, made by a shadow run of {}, is stored as an effect: a shadow's outputs are compared and thrown away",
                by.digest
            )
        })
    }

    /// Whether `record` is a key dead-lettered because the version that began its effects is
    /// gone for good (the production rule: never finished by another version).
    pub fn pinned_gone(&self, record: Option<&ClaimRecord>) -> bool {
        record.is_some_and(|r| {
            r.state == ClaimState::Failed
                && r.permanent
                && r.effects_by
                    .as_ref()
                    .is_some_and(|v| !self.versions.installed(v))
        })
    }

    /// The end check of `key`, whose record is `record`: its window outputs were stored by one
    /// version, and a key whose effects a version began is finished by that version (or
    /// dead-lettered).
    pub fn check(&self, key: &str, record: Option<&ClaimRecord>) -> Vec<String> {
        let mut out = Vec::new();
        let stored = self.stored.get(key).cloned().unwrap_or_default();
        if stored.len() > 1 {
            out.push(format!(
                "key {key}: its outputs were stored by versions {stored:?}: a re-run on another version mixed or doubled its effect"
            ));
        }
        let Some(r) = record else {
            return out;
        };
        if let Some(began) = &r.effects_by {
            if let Some(other) = stored.iter().find(|v| *v != began) {
                out.push(format!(
                    "key {key}: version {began} began its effects, and {other} stored some of them"
                ));
            }
            if r.state == ClaimState::Completed && r.digest != *began {
                out.push(format!(
                    "key {key}: version {began} began its effects, and {} finished it",
                    r.digest
                ));
            }
        }
        out
    }
}
