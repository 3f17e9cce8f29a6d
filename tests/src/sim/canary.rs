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
}

impl Found {
    /// The seeds needed to find it (`None`: not found).
    pub fn seeds(&self) -> Option<u64> {
        self.first.as_ref().map(|(seed, _, _)| seed + 1)
    }

    /// One line for the table: the fix, the seeds needed, the first seed's flags and its first
    /// violation.
    pub fn line(&self) -> String {
        match &self.first {
            Some((seed, mode, violations)) => format!(
                "{:<28} found at seed {seed}{} ({} runs): {}",
                self.fix.name(),
                mode.flags(),
                self.runs,
                violations.first().map(String::as_str).unwrap_or("")
            ),
            None => format!("{:<28} NOT found in {} runs", self.fix.name(), self.runs),
        }
    }
}

/// Runs seeds `0..budget` in every mode with `fix` reverted, up to the first failing run;
/// the switch is restored afterwards.
pub fn find(fix: Fix, budget: u64, base: Settings) -> Found {
    revert::set(&[fix]);
    let mut runs = 0;
    let mut first = None;
    'seeds: for seed in 0..budget {
        for mode in Mode::all() {
            runs += 1;
            let report = run(seed, Settings { mode, ..base }, false);
            if !report.violations.is_empty() {
                first = Some((seed, mode, report.violations));
                break 'seeds;
            }
        }
    }
    revert::set(&[]);
    Found { fix, first, runs }
}
