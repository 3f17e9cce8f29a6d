//! Candidates of routes served from files (a route's `component`, or `components.dir`):
//! `<name>.candidate.wasm` beside the live `<name>.wasm`, with its settings in
//! `<name>.candidate.toml` (optional; a shadow candidate without it). Hosts sharing the
//! directory share the candidate, and a decision is carried out on the files they all see: a
//! rollback renames the candidate to `<name>.candidate.wasm.rolled-back` (its reason in
//! `<name>.candidate.rolled-back.txt`), a promotion replaces the live file with it.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use tokio::sync::mpsc;

use super::spec::{Margins, Mode, Spec, State};
use super::Action;

/// The candidate file beside the live component file `live`.
pub fn candidate_path(live: &Path) -> PathBuf {
    live.with_extension("candidate.wasm")
}

/// The settings file of the candidate beside `live`.
pub fn settings_path(live: &Path) -> PathBuf {
    live.with_extension("candidate.toml")
}

/// `<name>.candidate.toml`: the flags of `dedup-host deploy --shadow | --canary`, as keys.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    /// `shadow` (default) or `canary`.
    #[serde(default)]
    mode: Option<String>,
    /// A canary's share of keys, 1-99.
    #[serde(default)]
    percent: Option<u8>,
    /// Shadow: run the live version twice to tell noise apart.
    #[serde(default)]
    secondary: bool,
    /// JSON pointers left out of payload comparisons.
    #[serde(default)]
    ignore: Vec<String>,
    /// Promote after this many clean runs.
    #[serde(default)]
    auto_promote: Option<u64>,
    /// Canary rollback margins.
    #[serde(default)]
    margins: Option<Margins>,
}

/// The spec of the candidate `bytes` beside `live`, from its settings file; says what is
/// wrong with the file and how to fix it.
pub fn spec(live: &Path, bytes: &[u8], since_ms: u64) -> Result<Spec, String> {
    let file = settings_path(live);
    let settings: Settings = match std::fs::read_to_string(&file) {
        Ok(text) => toml::from_str(&text).map_err(|e| format!("`{}`: {e}", file.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Settings::default(),
        Err(e) => return Err(format!("cannot read `{}`: {e}", file.display())),
    };
    let mode = match (settings.mode.as_deref(), settings.percent) {
        (None | Some("shadow"), None) => Mode::Shadow {
            secondary: settings.secondary,
        },
        (Some("canary"), Some(percent)) => Mode::Canary { percent },
        (Some("canary"), None) => {
            return Err(format!(
                "`{}`: a canary needs `percent = 1..99`",
                file.display()
            ))
        }
        (Some("shadow") | None, Some(_)) => {
            return Err(format!(
                "`{}`: `percent` is for `mode = \"canary\"`",
                file.display()
            ))
        }
        (Some(other), _) => {
            return Err(format!(
                "`{}`: mode `{other}` is neither `shadow` nor `canary`",
                file.display()
            ))
        }
    };
    let spec = Spec {
        digest: crate::runtime::digest(bytes),
        mode,
        ignore: settings.ignore,
        margins: settings.margins.unwrap_or_default(),
        auto_promote: settings.auto_promote,
        since_ms,
        state: State::Running,
    };
    spec.validate()
        .map_err(|e| format!("`{}`: {e}", file.display()))?;
    Ok(spec)
}

/// Carries out what this host decided about the candidate beside `live`, on the files.
pub async fn execute(live: PathBuf, by: String, mut decided: mpsc::UnboundedReceiver<Action>) {
    while let Some(action) = decided.recv().await {
        let done = match &action {
            Action::RollBack { reason, .. } => roll_back(&live, reason, &by),
            Action::Promote { .. } => promote(&live),
        };
        match done {
            Ok(()) => tracing::warn!(?action, "candidate decision carried out on the files"),
            Err(e) => tracing::error!(?action, "cannot carry out a candidate decision: {e}"),
        }
    }
}

/// Renames the candidate beside `live` out of the way, with why.
pub fn roll_back(live: &Path, reason: &str, by: &str) -> std::io::Result<()> {
    let candidate = candidate_path(live);
    let note = live.with_extension("candidate.rolled-back.txt");
    std::fs::write(&note, format!("rolled back by {by}: {reason}\n"))?;
    std::fs::rename(&candidate, candidate.with_extension("wasm.rolled-back"))
}

/// Replaces the live file with the candidate beside it (one rename: hosts see either).
pub fn promote(live: &Path) -> std::io::Result<()> {
    std::fs::rename(candidate_path(live), live)?;
    let _ = std::fs::remove_file(settings_path(live));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_make_a_spec_or_say_what_to_fix() {
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("ledger.wasm");
        assert_eq!(
            candidate_path(&live),
            dir.path().join("ledger.candidate.wasm")
        );
        let shadow = spec(&live, b"x", 1).unwrap();
        assert_eq!(shadow.mode, Mode::Shadow { secondary: false });
        std::fs::write(settings_path(&live), "mode = \"canary\"\npercent = 20\n").unwrap();
        assert_eq!(
            spec(&live, b"x", 1).unwrap().mode,
            Mode::Canary { percent: 20 }
        );
        std::fs::write(settings_path(&live), "mode = \"canary\"\n").unwrap();
        assert!(spec(&live, b"x", 1)
            .unwrap_err()
            .contains("percent = 1..99"));
        std::fs::write(settings_path(&live), "mode = \"canary\"\npercent = 100\n").unwrap();
        assert!(spec(&live, b"x", 1).unwrap_err().contains("1% to 99%"));
        std::fs::write(settings_path(&live), "mdoe = \"canary\"\n").unwrap();
        assert!(spec(&live, b"x", 1).unwrap_err().contains("mdoe"));
    }
}
