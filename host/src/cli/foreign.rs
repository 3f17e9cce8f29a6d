//! Which of a config's routes are another deployment's on the server, as `dedup-host routes`
//! reports them: two configs that share a stream and a route name share the route's consumer,
//! contract and component, and the hosts `routes` lists for it may be the other team's.

use std::collections::BTreeMap;

use async_nats::jetstream::Context;

use crate::components::store;
use crate::config::Config;
use crate::ownership::Conflict;

/// Why route `route` of this config is another deployment's on the server: what the other
/// deployment holds (both deployments named), what the listed hosts then serve, and the fix.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Foreign {
    /// The route of this config.
    pub route: String,
    /// The other deployment (`?` when the server does not record it).
    pub owner: String,
    /// This config's deployment.
    pub mine: String,
    /// What the other deployment holds, one item each.
    pub holds: Vec<String>,
}

impl Foreign {
    /// The warning `routes` prints under the route, and lists among what it found.
    pub fn message(&self) -> String {
        let (route, owner, mine) = (&self.route, &self.owner, &self.mine);
        format!(
            "route `{route}` is deployment `{owner}`'s on this server, not this config's (deployment `{mine}`): {}. The hosts listed for it serve deployment `{owner}`'s route, not this config's. If this config is that deployment, set `[deployment] name = \"{owner}\"`; otherwise give the route a name of its own, or this config its own `[source] stream`, then run `dedup-host setup`",
            self.holds.join("; ")
        )
    }
}

/// Every route of `config` that another deployment holds on the server (its consumer, its
/// contract or its component in the store), by route name. Reads only.
pub async fn routes(js: &Context, config: &Config) -> anyhow::Result<BTreeMap<String, Foreign>> {
    let mine = config.deployment_name();
    let mut found: BTreeMap<String, Foreign> = BTreeMap::new();
    let mut note = |route: &str, owner: Option<&str>, what: String| {
        let entry = found.entry(route.to_string()).or_insert_with(|| Foreign {
            route: route.to_string(),
            owner: "?".into(),
            mine: mine.clone(),
            holds: Vec::new(),
        });
        if let (Some(owner), "?") = (owner, entry.owner.as_str()) {
            entry.owner = owner.to_string();
        }
        entry.holds.push(what);
    };
    for conflict in crate::ownership::check(js, config).await? {
        match &conflict {
            Conflict::Owned {
                kind,
                name,
                owner,
                route: Some(route),
                ..
            } => note(
                route,
                Some(owner),
                format!("its {kind} `{name}` belongs to deployment `{owner}`"),
            ),
            Conflict::Consumer {
                name,
                route,
                recorded,
                mine,
            } => note(
                route,
                None,
                format!("its contract `{name}` was recorded for consumer `{recorded}`, not this config's `{mine}`"),
            ),
            _ => {}
        }
    }
    let bucket = &config.components.bucket;
    if let Ok(objects) = js.get_object_store(bucket).await {
        for r in config
            .routes
            .iter()
            .filter(|r| config.component_file(r).is_none())
        {
            let Some(by) = store::deployer(&objects, &r.name).await else {
                continue;
            };
            let (consumer, deployment) = (by.consumer.as_deref(), by.deployment.as_deref());
            let owned = crate::ownership::component_conflict(
                js,
                config,
                (bucket, &r.name),
                consumer,
                deployment,
            )
            .await?;
            if let Some(owned) = owned {
                note(
                    &r.name,
                    deployment,
                    format!(
                        "its component `{}` was deployed by deployment `{}`",
                        owned.name, owned.owner
                    ),
                );
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warning_names_both_deployments_and_the_fix() {
        let foreign = Foreign {
            route: "handler".into(),
            owner: "auto-1".into(),
            mine: "auto-2".into(),
            holds: vec!["its consumer `dedup-host-handler` belongs to deployment `auto-1`".into()],
        };
        let text = foreign.message();
        for part in [
            "route `handler` is deployment `auto-1`'s",
            "(deployment `auto-2`)",
            "serve deployment `auto-1`'s route",
            "`[deployment] name = \"auto-1\"`",
            "its own `[source] stream`",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
    }
}
