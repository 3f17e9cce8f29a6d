//! How a role's permissions are printed: a nats-server configuration block (a variable the
//! operator names in `authorization { users = [...] }` or an account's users), or JSON.

use super::Permissions;

impl Permissions {
    /// The variable name the configuration block defines: `DEDUP_HOST_PERMISSIONS`, ...
    pub fn variable(&self) -> String {
        format!("DEDUP_{}_PERMISSIONS", self.role.name().to_uppercase())
    }

    /// nats-server configuration text: the permissions as a variable, then a commented
    /// `authorization` block using it. Subjects are quoted (`$JS...` unquoted would be read
    /// as a variable).
    pub fn to_conf(&self) -> String {
        let list = |subjects: &[String]| {
            subjects
                .iter()
                .map(|s| format!("      {}", quote(s)))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let role = self.role.name();
        let mut out = format!(
            "# dedup-host permissions of role `{role}` for deployment `{}`.\n# Regenerate after adding routes, streams or buckets to the config.\n{} = {{\n  publish: {{\n    allow: [\n{}\n    ]\n  }}\n  subscribe: {{\n    allow: [\n{}\n    ]\n  }}\n",
            self.deployment,
            self.variable(),
            list(&self.publish),
            list(&self.subscribe),
        );
        if self.allow_responses {
            out.push_str("  # Answer requests on their reply subjects only (reload, serving probes).\n  allow_responses: true\n");
        }
        out.push_str(&format!(
            "}}\n# authorization {{\n#   users = [\n#     {{ user: \"dedup-{role}\", password: $DEDUP_{}_PASSWORD, permissions: ${} }}\n#   ]\n# }}\n",
            role.to_uppercase(),
            self.variable()
        ));
        out
    }

    /// The JSON form: `{"role", "deployment", "publish": {"allow": [...]}, "subscribe":
    /// {"allow": [...]}, "allow_responses"}`, the shape of nats-server's permissions.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "role": self.role,
            "deployment": self.deployment,
            "publish": { "allow": self.publish },
            "subscribe": { "allow": self.subscribe },
            "allow_responses": self.allow_responses,
        })
    }
}

/// A subject as a double-quoted configuration string.
fn quote(subject: &str) -> String {
    serde_json::to_string(subject).expect("a string serializes")
}

#[cfg(test)]
mod tests {
    use super::super::Role;
    use super::*;

    #[test]
    fn subjects_are_quoted_and_the_block_is_named() {
        let p = Permissions {
            role: Role::Host,
            deployment: "d".into(),
            publish: vec!["$JS.API.INFO".into()],
            subscribe: vec!["_INBOX.>".into()],
            allow_responses: true,
        };
        let conf = p.to_conf();
        assert!(conf.contains("DEDUP_HOST_PERMISSIONS = {"), "{conf}");
        assert!(conf.contains("\"$JS.API.INFO\""), "{conf}");
        assert!(conf.contains("allow_responses: true"), "{conf}");
        assert_eq!(p.to_json()["publish"]["allow"][0], "$JS.API.INFO");
    }
}
