//! A candidate's settings, kept on the server with its bytes (object metadata), so every host
//! serving the route runs it the same way.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// How a candidate runs beside the live version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Mode {
    /// Runs on every message the live version handles, its outputs compared and thrown away.
    Shadow {
        /// Also runs the live version a second time, so nondeterministic outputs show up as
        /// noise between two live runs and are reported apart.
        #[serde(default)]
        secondary: bool,
    },
    /// Runs `percent` % of keys (by a stable hash of the key) with real effects.
    Canary {
        /// The share of keys, 1 to 99.
        percent: u8,
    },
}

impl Mode {
    /// The `mode` label and the word `routes` prints.
    pub fn label(&self) -> &'static str {
        match self {
            Mode::Shadow { .. } => "shadow",
            Mode::Canary { .. } => "canary",
        }
    }

    /// How a host reports it in its status (`shadow`, `canary 20%`): the mode and its share,
    /// so `--wait` after a change of share (or from shadow to canary) waits for the change.
    pub fn status(&self) -> String {
        match self {
            Mode::Shadow { .. } => "shadow".into(),
            Mode::Canary { percent } => format!("canary {percent}%"),
        }
    }
}

/// How much worse than the live version a canary may be before it is rolled back on every
/// host. Rates are fractions of runs over the last `window` runs of each version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Margins {
    /// Runs of each version a decision looks at (a sliding window).
    pub window: usize,
    /// Candidate runs needed before any decision.
    pub min_runs: usize,
    /// Largest accepted rise of the reject rate (0.05: 5 points).
    pub rejects: f64,
    /// Largest accepted rise of the trap rate.
    pub traps: f64,
    /// Largest accepted rise of the retry rate.
    pub retries: f64,
    /// Largest accepted ratio of the candidate's p99 guest time to the live version's.
    pub p99_ratio: f64,
}

impl Default for Margins {
    fn default() -> Self {
        Self {
            window: 200,
            min_runs: 20,
            rejects: 0.05,
            traps: 0.05,
            retries: 0.10,
            p99_ratio: 3.0,
        }
    }
}

/// What became of a candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum State {
    /// Running beside the live version.
    Running,
    /// Rolled back automatically: no host runs it any more.
    RolledBack {
        /// Why, with the figures that decided it.
        reason: String,
        /// The host that decided.
        by: String,
        /// When, in Unix milliseconds.
        at_ms: u64,
    },
}

/// Everything about a candidate but its bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Spec {
    /// The candidate's `sha256:` digest.
    pub digest: String,
    /// Shadow or canary.
    #[serde(flatten)]
    pub mode: Mode,
    /// JSON pointers (`/ran_ms`, `/items/*/id`) left out of payload comparisons.
    #[serde(default)]
    pub ignore: Vec<String>,
    /// Rollback margins of a canary.
    #[serde(default)]
    pub margins: Margins,
    /// Promote automatically after this many runs with no difference (shadow) or no
    /// regression (canary), counted on one host.
    #[serde(default)]
    pub auto_promote: Option<u64>,
    /// When it was deployed, in Unix milliseconds.
    pub since_ms: u64,
    /// Running or rolled back.
    #[serde(flatten)]
    pub state: State,
}

/// A candidate setting that cannot be used.
#[derive(Debug, Error, PartialEq)]
pub enum SpecError {
    /// The canary share is outside 1-99.
    #[error("canary share {0}% is outside 1-99: give --canary a percentage from 1% to 99% (promote to run every key on it)")]
    Share(u8),
    /// An ignore path that is not a JSON pointer.
    #[error("ignore path `{0}` is not a JSON pointer: write it as `/field/sub` (`*` matches any one segment)")]
    Ignore(String),
    /// A margin that is not a positive number.
    #[error("canary margin {0} must be a positive number")]
    Margin(&'static str),
}

impl Spec {
    /// Checks the settings, naming what to fix.
    pub fn validate(&self) -> Result<(), SpecError> {
        if let Mode::Canary { percent } = self.mode {
            if !(1..=99).contains(&percent) {
                return Err(SpecError::Share(percent));
            }
        }
        if let Some(bad) = self.ignore.iter().find(|p| !p.starts_with('/')) {
            return Err(SpecError::Ignore(bad.clone()));
        }
        let m = &self.margins;
        for (name, value) in [
            ("rejects", m.rejects),
            ("traps", m.traps),
            ("retries", m.retries),
            ("p99_ratio", m.p99_ratio),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(SpecError::Margin(name));
            }
        }
        if m.window == 0 || m.min_runs == 0 {
            return Err(SpecError::Margin("window and min_runs"));
        }
        Ok(())
    }

    /// Whether the candidate runs at all.
    pub fn running(&self) -> bool {
        self.state == State::Running
    }
}

/// Parses `--canary`'s share: `20%` or `20`.
pub fn parse_share(text: &str) -> Result<u8, String> {
    let number = text.trim().trim_end_matches('%');
    match number.parse::<u8>() {
        Ok(p) if (1..=99).contains(&p) => Ok(p),
        _ => Err(format!(
            "`{text}` is not a share from 1% to 99%: write it as `20%`"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(mode: Mode) -> Spec {
        Spec {
            digest: "sha256:ab".into(),
            mode,
            ignore: vec!["/ran_ms".into()],
            margins: Margins::default(),
            auto_promote: None,
            since_ms: 1,
            state: State::Running,
        }
    }

    #[test]
    fn a_spec_round_trips_through_json_and_refuses_bad_settings() {
        let s = spec(Mode::Canary { percent: 20 });
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<Spec>(&json).unwrap(), s);
        assert_eq!(s.validate(), Ok(()));
        assert_eq!(
            spec(Mode::Canary { percent: 0 }).validate(),
            Err(SpecError::Share(0))
        );
        let mut bad = spec(Mode::Shadow { secondary: true });
        bad.ignore = vec!["ran_ms".into()];
        assert_eq!(bad.validate(), Err(SpecError::Ignore("ran_ms".into())));
        assert_eq!(parse_share("20%"), Ok(20));
        assert!(parse_share("100%").unwrap_err().contains("1% to 99%"));
        assert!(parse_share("x").is_err());
    }
}
