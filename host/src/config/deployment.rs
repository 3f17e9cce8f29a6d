//! `[deployment]`: which deployment a config belongs to (DESIGN.md rule 23). What a
//! deployment creates on the server (the source stream, route consumers, contracts) records
//! this name, and a command run with another deployment's config is refused before it
//! rebinds, re-records or overwrites any of it.

use serde::{Deserialize, Serialize};

use super::Config;

/// Which deployment a config belongs to. `setup` and the hosts record it as the owner of the
/// source stream, route consumers and contracts they create; a config of another deployment
/// that would rebind one of those consumers (other filter subjects), take a contract as its
/// own, or deploy over its component is refused with both names before anything changes, and
/// `setup --plan` refuses a change to a stream another deployment uses unless
/// `--share-stream S` names it. Something recorded before owners were (no owner) is adopted
/// by the first deployment that sets it up.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DeploymentConfig {
    /// Its name, recorded as the owner of what it creates. Unset: `auto-<hash>` of the source
    /// stream and the subjects it captures; when those
    /// change, an explicit `setup` moves what the former default name owns to the new one.
    /// Set it to adopt what another name recorded.
    pub name: Option<String>,
}

impl Config {
    /// This config's deployment name: `deployment.name`, or `auto-` and a hash of the source
    /// stream and its subjects. Two configs written independently share the default only when
    /// they capture the very same subjects of the same stream (they then consume the same
    /// messages anyway); hosts of one deployment agree on it wherever their config file lives.
    pub fn deployment_name(&self) -> String {
        if let Some(name) = &self.deployment.name {
            return name.clone();
        }
        let mut subjects = self.source_subjects();
        subjects.sort();
        subjects.dedup();
        let mut text = self.source.stream.clone();
        for s in &subjects {
            text.push('\n');
            text.push_str(s);
        }
        format!("{AUTO_PREFIX}{:016x}", fnv1a(text.as_bytes()))
    }
}

impl Config {
    /// The subject this deployment's hosts listen on for `dedup-host reload`: per deployment
    /// when `[deployment] name` is set (another deployment on the source stream cannot reach
    /// these hosts), per source stream otherwise ([`crate::subject::reload_subject`]).
    pub fn reload_subject(&self) -> String {
        crate::subject::reload_subject(&self.source.stream, self.deployment.name.as_deref())
    }
}

/// The prefix of a default (`auto-`) deployment name.
pub const AUTO_PREFIX: &str = "auto-";

impl Config {
    /// Whether `owner`, recorded on the server, is another deployment than this config's:
    /// names compare exactly. A default name changes with the source subjects, so a
    /// deployment's own former default name is recognised by what it owns, not here, and
    /// moved to the current name by an explicit `setup` ([`crate::ownership`]).
    pub fn is_other_deployment(&self, owner: &str) -> bool {
        owner != self.deployment_name()
    }
}

impl DeploymentConfig {
    /// Whether `name` is a default (`auto-`) deployment name.
    pub fn is_default(name: &str) -> bool {
        name.starts_with(AUTO_PREFIX)
    }
}

/// FNV-1a, 64 bits: stable across builds and Rust versions (unlike `DefaultHasher`), which a
/// name recorded on the server needs.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    fn config(extra: &str, subjects: &str) -> super::Config {
        let text = format!(
            "[nats]\nurls = [\"nats://127.0.0.1:4222\"]\n{extra}\n[source]\nsubjects = [{subjects}]\n[[routes]]\nname = \"handler\"\nsubject = \"x.*\"\n"
        );
        super::Config::parse(&text, Path::new("t.toml"), std::env::temp_dir()).expect("valid")
    }

    #[test]
    fn names_compare_exactly_a_former_default_name_included() {
        let grown = config("", "\"x.*\", \"y.*\"");
        let first = config("", "\"x.*\"").deployment_name();
        assert_ne!(
            grown.deployment_name(),
            first,
            "the default hashes the subjects"
        );
        assert!(
            grown.is_other_deployment(&first),
            "another default name is another deployment (a former one of its own is recognised by what it owns)"
        );
        assert!(!grown.is_other_deployment(&grown.deployment_name()));
        assert!(grown.is_other_deployment("shop"));
        let named = config("[deployment]\nname = \"shop\"", "\"x.*\"");
        assert!(!named.is_other_deployment("shop"));
        assert!(named.is_other_deployment(&first));
    }

    #[test]
    fn the_default_name_follows_the_captured_subjects_and_a_set_name_wins() {
        let shipping = config("", "\"shipping.*\", \"x.*\"");
        let billing = config("", "\"billing.*\", \"x.*\"");
        assert_ne!(shipping.deployment_name(), billing.deployment_name());
        assert!(shipping.deployment_name().starts_with("auto-"));
        let reordered = config("", "\"x.*\", \"shipping.*\"");
        assert_eq!(shipping.deployment_name(), reordered.deployment_name());
        let named = config("[deployment]\nname = \"team-1\"", "\"x.*\"");
        assert_eq!(named.deployment_name(), "team-1");
    }
}
