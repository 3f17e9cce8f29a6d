//! Default names that keep deployments apart. Two configs with different source streams share
//! nothing by default: the claim bucket, the dead-letter stream and subject and the component
//! buckets are named after the source stream, unless the config names them. A config on the
//! default source stream (`DEDUP_EVENTS`) keeps the original shared names, so deployments made
//! before this rule keep their records.

use super::{Config, DEFAULT_STREAM};

/// A name the config may leave to the default: its field path, and the default for a source
/// stream other than [`DEFAULT_STREAM`].
struct Derived {
    path: [&'static str; 2],
    name: fn(&str) -> String,
    get: fn(&Config) -> &String,
    set: fn(&mut Config, String),
}

const DERIVED: [Derived; 5] = [
    Derived {
        path: ["claims", "bucket"],
        name: |s| format!("dedup-claims-{s}"),
        get: |c| &c.claims.bucket,
        set: |c, n| c.claims.bucket = n,
    },
    Derived {
        path: ["dead_letter", "stream"],
        name: |s| format!("{s}_DEAD"),
        get: |c| &c.dead_letter.stream,
        set: |c, n| c.dead_letter.stream = n,
    },
    Derived {
        path: ["dead_letter", "subject"],
        name: |s| format!("dedup.dead.{s}"),
        get: |c| &c.dead_letter.subject,
        set: |c, n| c.dead_letter.subject = n,
    },
    Derived {
        path: ["components", "bucket"],
        name: |s| format!("dedup-components-{s}"),
        get: |c| &c.components.bucket,
        set: |c, n| c.components.bucket = n,
    },
    Derived {
        path: ["components", "status_bucket"],
        name: |s| format!("dedup-hosts-{s}"),
        get: |c| &c.components.status_bucket,
        set: |c, n| c.components.status_bucket = n,
    },
];

impl Config {
    /// Names the config leaves to the default after its source stream (see the module
    /// documentation); `table` is the parsed file, which tells what it names itself.
    pub(super) fn derive_names(&mut self, table: &toml::Table) {
        let stream = self.source.stream.clone();
        if stream == DEFAULT_STREAM {
            return;
        }
        for d in &DERIVED {
            let named = table
                .get(d.path[0])
                .and_then(|section| section.get(d.path[1]))
                .is_some();
            if !named {
                (d.set)(self, (d.name)(&stream));
            }
        }
    }

    /// The names this config took from its source stream, as `field = "name"` lines: what an
    /// older deployment of the same stream must write to keep its shared names.
    pub fn derived_names(&self) -> Vec<String> {
        if self.source.stream == DEFAULT_STREAM {
            return Vec::new();
        }
        let legacy = Config::default();
        DERIVED
            .iter()
            .filter(|d| *(d.get)(self) == (d.name)(&self.source.stream))
            .map(|d| format!("{} = \"{}\"", d.path.join("."), (d.get)(&legacy)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    fn config(extra: &str) -> super::Config {
        let text = format!(
            "[nats]\nurls = [\"nats://127.0.0.1:4222\"]\n{extra}\n[[routes]]\nname = \"r\"\nsubject = \"shop.r\"\n"
        );
        super::Config::parse(&text, Path::new("t.toml"), std::env::temp_dir()).expect("valid")
    }

    #[test]
    fn two_sources_share_no_default_name_and_named_ones_win() {
        let shop = config("[source]\nstream = \"SHOP\"\nsubjects = [\"shop.>\"]");
        let pay = config("[source]\nstream = \"PAY\"\nsubjects = [\"shop.>\"]");
        assert_eq!(shop.claims.bucket, "dedup-claims-SHOP");
        assert_eq!(shop.dead_letter.stream, "SHOP_DEAD");
        assert_eq!(shop.dead_letter.subject, "dedup.dead.SHOP");
        assert_eq!(shop.components.bucket, "dedup-components-SHOP");
        assert_eq!(shop.components.status_bucket, "dedup-hosts-SHOP");
        assert_ne!(shop.claims.bucket, pay.claims.bucket);
        assert_eq!(shop.derived_names().len(), 5);
        let named = config("[source]\nstream = \"SHOP\"\nsubjects = [\"shop.>\"]\n[claims]\nbucket = \"dedup-claims\"");
        assert_eq!(named.claims.bucket, "dedup-claims");
        assert_eq!(named.dead_letter.stream, "SHOP_DEAD");
        let default = config("[source]\nsubjects = [\"shop.>\"]");
        assert_eq!(default.claims.bucket, "dedup-claims");
        assert_eq!(default.dead_letter.stream, "DEDUP_DEAD");
        assert!(default.derived_names().is_empty());
    }
}
