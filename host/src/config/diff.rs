//! What a config reload changes: routes added, removed and changed (applied live), and the
//! settings that only take effect after a restart (reported, never half-applied).

use serde::{Deserialize, Serialize};

use super::Config;

/// The difference between the running config and a new one.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigDiff {
    /// Routes only the new config has.
    pub added: Vec<String>,
    /// Routes only the running config has.
    pub removed: Vec<String>,
    /// Routes whose settings differ (subject, key, limits, grants, concurrency, component).
    pub changed: Vec<String>,
    /// Sections that differ but cannot change while the host runs.
    pub restart_needed: Vec<String>,
}

impl ConfigDiff {
    /// Compares `old` (running) with `new`.
    pub fn between(old: &Config, new: &Config) -> Self {
        let mut diff = Self::default();
        for r in &new.routes {
            match old.routes.iter().find(|o| o.name == r.name) {
                None => diff.added.push(r.name.clone()),
                Some(o) if o != r => diff.changed.push(r.name.clone()),
                Some(_) => {}
            }
        }
        for o in &old.routes {
            if !new.routes.iter().any(|r| r.name == o.name) {
                diff.removed.push(o.name.clone());
            }
        }
        let sections = [
            ("nats", old.nats == new.nats),
            ("host", old.host == new.host),
            ("source", old.source == new.source),
            ("claims", old.claims == new.claims),
            ("dead_letter", old.dead_letter == new.dead_letter),
            ("output_streams", old.output_streams == new.output_streams),
            ("components", old.components == new.components),
            ("deployment", old.deployment == new.deployment),
        ];
        diff.restart_needed = sections
            .iter()
            .filter(|(_, same)| !same)
            .map(|(name, _)| format!("[{name}]"))
            .collect();
        diff
    }

    /// Whether the routes differ.
    pub fn routes_differ(&self) -> bool {
        !(self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn config(routes: &str, host: &str) -> Config {
        let text = format!(
            "[nats]\nurls = [\"nats://127.0.0.1:4222\"]\n[host]\n{host}\n[source]\nsubjects = [\"in.>\"]\n{routes}"
        );
        Config::parse(&text, Path::new("t.toml"), std::env::temp_dir()).expect("valid")
    }

    const A: &str = "[[routes]]\nname = \"a\"\nsubject = \"in.a\"\n";
    const B: &str = "[[routes]]\nname = \"b\"\nsubject = \"in.b\"\n";
    const B2: &str = "[[routes]]\nname = \"b\"\nsubject = \"in.b\"\nconcurrency = 3\n";
    const C: &str = "[[routes]]\nname = \"c\"\nsubject = \"in.c\"\n";

    #[test]
    fn names_added_removed_changed_routes_and_restart_only_sections() {
        let old = config(&format!("{A}{B}"), "");
        let new = config(&format!("{B2}{C}"), "concurrency = 9");
        let diff = ConfigDiff::between(&old, &new);
        assert_eq!(diff.added, ["c"]);
        assert_eq!(diff.removed, ["a"]);
        assert_eq!(diff.changed, ["b"]);
        assert_eq!(diff.restart_needed, ["[host]"]);
        assert!(ConfigDiff::between(&old, &old) == ConfigDiff::default());
    }
}
