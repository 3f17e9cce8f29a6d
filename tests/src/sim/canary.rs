//! Reverted-fix canaries: each of the host's fixes undone in turn by its test-only switch
//! ([`dedup_delivery::revert`]), and how many seeds the simulation needs to find it (the
//! table in `docs/src/how/simulation.md`).

use dedup_delivery::revert::{self, Fix};

use super::{run, Mode, Settings};

/// What the simulation found with one fix reverted.
#[derive(Debug, Clone)]
pub struct Found {
    /// The reverted fix.
    pub fix: Fix,
    /// The first failing seed and mode, with the violations it reported; `None`: none failed
    /// within the budget.
    pub first: Option<(u64, Mode, Vec<String>)>,
    /// Runs made (seeds tried × modes, up to and including the first failure).
    pub runs: u64,
    /// Runs that failed with nothing reverted too (seed, mode, first violation): a fault of
    /// the model or of the host, not this fix's canary; the search goes past them.
    pub clean_failures: Vec<(u64, Mode, String)>,
}

impl Found {
    /// The seeds needed to find it (`None`: not found).
    pub fn seeds(&self) -> Option<u64> {
        self.first.as_ref().map(|(seed, _, _)| seed + 1)
    }

    /// One line for the table: the fix, the seeds needed, the first seed's flags and its first
    /// violation.
    pub fn line(&self) -> String {
        let found = match &self.first {
            Some((seed, mode, violations)) => format!(
                "{:<28} found at seed {seed}{} ({} runs): {}",
                self.fix.name(),
                mode.flags(),
                self.runs,
                violations.first().map(String::as_str).unwrap_or("")
            ),
            None => format!("{:<28} NOT found in {} runs", self.fix.name(), self.runs),
        };
        let skipped = self.clean_failures.iter().map(|(seed, mode, violation)| {
            format!(
                "\n{:<28}   (seed {seed}{} fails with nothing reverted too: {violation})",
                "",
                mode.flags()
            )
        });
        found + &skipped.collect::<String>()
    }
}

/// Fixes whose seed shows their harm only with another fix reverted too, one that now keeps
/// the harm's scenario out of the model (the seed must pass with that one reverted alone):
/// `mark-spends-no-attempt` needs a claim-after key still failed, its message naked, as
/// `setup --change-route` to claim before runs, which `change-waits-for-claim-after` refuses
/// (no seed below 40,000 finds it with that fix in place; replay with `simulate --revert
/// mark-spends-no-attempt,change-waits-for-claim-after`).
pub const ALSO_REVERTED: &[(Fix, Fix)] =
    &[(Fix::MarkSpendsNoAttempt, Fix::ChangeWaitsForClaimAfter)];

/// The fixes reverted beside `fix` when its canary is searched or replayed
/// ([`ALSO_REVERTED`]); none for most.
pub fn also_reverted(fix: Fix) -> Vec<Fix> {
    (ALSO_REVERTED.iter())
        .filter(|(f, _)| *f == fix)
        .map(|(_, other)| *other)
        .collect()
}

/// Runs seeds `0..budget` in every mode with `fix` reverted (with [`also_reverted`]), up to
/// the first run that fails with it reverted and passes without it (the others still
/// reverted); the switches are restored afterwards.
pub fn find(fix: Fix, budget: u64, base: Settings) -> Found {
    let mut runs = 0;
    let mut first = None;
    let mut clean_failures = Vec::new();
    let also = also_reverted(fix);
    let with_fix: Vec<Fix> = [&[fix][..], &also].concat();
    'seeds: for seed in 0..budget {
        for mode in Mode::all() {
            runs += 1;
            let settings = Settings { mode, ..base };
            revert::set(&with_fix);
            let report = run(seed, settings, false);
            if report.violations.is_empty() {
                revert::set(&[]);
                continue;
            }
            revert::set(&also);
            let clean = run(seed, settings, false);
            revert::set(&[]);
            match clean.violations.first() {
                Some(clean) => clean_failures.push((seed, mode, clean.clone())),
                None => {
                    first = Some((seed, mode, report.violations));
                    break 'seeds;
                }
            }
        }
    }
    Found {
        fix,
        first,
        runs,
        clean_failures,
    }
}
