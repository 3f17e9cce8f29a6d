//! Which of a config's routes are another deployment's on the server, as `dedup-host routes`
//! reports them: two configs that share a stream and a route name share the route's consumer,
//! contract and component, and the hosts `routes` lists for it may be the other team's.

use std::collections::BTreeMap;

use async_nats::jetstream::Context;

use crate::components::store;
use crate::config::Config;
use crate::ownership::Conflict;

/// Why route `route` of this config is another deployment's on the server: what the other
/// deployment holds (both deployments named when the server records them), what the listed
/// hosts then serve, and the fix.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Foreign {
    /// The route of this config.
    pub route: String,
    /// The other deployment, when the server records it (not for a contract recorded for
    /// another consumer of the route: see `consumer`).
    pub owner: Option<String>,
    /// The consumer the route's contract was recorded for, when it is not this config's.
    pub consumer: Option<String>,
    /// This config's deployment.
    pub mine: String,
    /// What the other deployment holds, one item each.
    pub holds: Vec<String>,
}

impl Foreign {
    /// The warning `routes` prints under the route, and lists among what it found.
    pub fn message(&self) -> String {
        let (route, mine, holds) = (&self.route, &self.mine, self.holds.join("; "));
        let otherwise = "otherwise give the route a name of its own, or this config its own `[source] stream`, then run `dedup-host setup`";
        match (&self.owner, &self.consumer) {
            (Some(owner), _) => format!(
                "route `{route}` is deployment `{owner}`'s on this server, not this config's (deployment `{mine}`): {holds}. The hosts listed for it serve deployment `{owner}`'s route, not this config's. If this config is that deployment, set `[deployment] name = \"{owner}\"`; {otherwise}"
            ),
            (None, consumer) => {
                let was = (consumer.as_ref()).map_or(String::new(), |c| {
                    format!(" (the route's consumer was `{c}`)")
                });
                format!(
                    "route `{route}` is another deployment's on this server, not this config's (deployment `{mine}`): {holds}. The hosts listed for it may serve that deployment's route, not this config's. If this config is that deployment, set its `[source] consumer` back to what it was{was}; {otherwise}"
                )
            }
        }
    }
}

/// The routes of a config (deployment `mine`) that another deployment holds, as found.
struct Found {
    mine: String,
    routes: BTreeMap<String, Foreign>,
}

impl Found {
    fn new(mine: String) -> Self {
        Found {
            mine,
            routes: BTreeMap::new(),
        }
    }

    /// Notes that deployment `owner` (when known) holds `what` of route `route`.
    fn note(&mut self, route: &str, owner: Option<&str>, what: String) -> &mut Foreign {
        let entry = self
            .routes
            .entry(route.to_string())
            .or_insert_with(|| Foreign {
                route: route.to_string(),
                owner: None,
                consumer: None,
                mine: self.mine.clone(),
                holds: Vec::new(),
            });
        if entry.owner.is_none() {
            entry.owner = owner.map(str::to_string);
        }
        entry.holds.push(what);
        entry
    }

    /// Notes an ownership conflict ([`crate::ownership::check`]) that makes a route another
    /// deployment's.
    fn conflict(&mut self, conflict: &Conflict) {
        match conflict {
            Conflict::Owned {
                kind,
                name,
                owner,
                route: Some(route),
                ..
            } => {
                let what = format!("its {kind} `{name}` belongs to deployment `{owner}`");
                self.note(route, Some(owner), what);
            }
            Conflict::Consumer {
                name,
                route,
                recorded,
                mine,
            } => {
                let what = format!("its contract `{name}` was recorded for consumer `{recorded}`, not this config's `{mine}`");
                let entry = self.note(route, None, what);
                entry.consumer.get_or_insert_with(|| recorded.clone());
            }
            _ => {}
        }
    }
}

/// Every route of `config` that another deployment holds on the server (its consumer, its
/// contract or its component in the store), by route name. Reads only.
pub async fn routes(js: &Context, config: &Config) -> anyhow::Result<BTreeMap<String, Foreign>> {
    let mut found = Found::new(config.deployment_name());
    for conflict in crate::ownership::check(js, config).await? {
        found.conflict(&conflict);
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
                let entry = found.note(
                    &r.name,
                    deployment,
                    format!(
                        "its component `{}` was deployed by deployment `{}`",
                        owned.name, owned.owner
                    ),
                );
                if let Some(consumer) = consumer {
                    entry.consumer.get_or_insert_with(|| consumer.to_string());
                }
            }
        }
    }
    Ok(found.routes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warning_names_both_deployments_and_the_fix() {
        let mut found = Found::new("auto-2".into());
        found.conflict(&Conflict::Owned {
            kind: "consumer",
            name: "dedup-host-handler".into(),
            owner: "auto-1".into(),
            mine: "auto-2".into(),
            would: "rebind it".into(),
            route: Some("handler".into()),
        });
        let text = found.routes["handler"].message();
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

    /// A contract recorded for another consumer names no deployment: the fix is the
    /// consumer (or a name of its own), never a deployment name the server does not know.
    #[test]
    fn a_contract_of_another_consumer_names_the_consumer_fix_not_a_deployment() {
        let mut found = Found::new("auto-2".into());
        found.conflict(&Conflict::Consumer {
            name: "dedup-contracts/handler".into(),
            route: "handler".into(),
            recorded: "team1-handler".into(),
            mine: "dedup-host-handler".into(),
        });
        let foreign = &found.routes["handler"];
        assert_eq!(foreign.owner, None);
        let text = foreign.message();
        for part in [
            "route `handler` is another deployment's",
            "(deployment `auto-2`)",
            "recorded for consumer `team1-handler`",
            "`[source] consumer` back",
            "`team1-handler`",
            "a name of its own",
            "its own `[source] stream`",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
        assert!(!text.contains("[deployment] name"), "{text}");
        assert!(!text.contains('?'), "{text}");
    }
}
