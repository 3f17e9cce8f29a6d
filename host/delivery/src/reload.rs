//! What a config reload does with a host's routes, as plain data: which routes keep running
//! untouched, which start (added, or replacing a changed one, whose guest carries over when
//! its component is the same), which retire, and which fenced routes refuse the reload
//! because no running output stream fences them. The host's `Live::reload`
//! (`host/src/serve/live.rs`) applies the plan over its served set; the simulation's hosts
//! apply the same plan to their model routes.

/// The routes a reload adds, removes and changes (the host's `ConfigDiff`).
#[derive(Debug, Clone, Copy)]
pub struct Diff<'a> {
    /// Routes only the new config has.
    pub added: &'a [String],
    /// Routes only the running config has.
    pub removed: &'a [String],
    /// Routes whose settings differ.
    pub changed: &'a [String],
}

/// What becomes of one route of the new config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// It runs on as it is: nothing of it changed.
    Keep,
    /// A new route starts (its contract is checked as it starts).
    Start {
        /// Whether the reload added it (its component is loaded anew).
        added: bool,
        /// Whether it replaces a route of its name in the set, which drains: the version that
        /// route serves (and its shadow or canary candidate) carries over to the new one when
        /// its component is the same.
        replaces: bool,
    },
}

/// What a reload does with a host's routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Every route of the new config, in its order, with its step.
    pub steps: Vec<(String, Step)>,
    /// Routes only the running config has: they stop pulling and drain.
    pub retired: Vec<String>,
}

/// The plan for the new config's routes, `routes` (each name with whether the host's route
/// set has a route of that name now, served or refused), given the reload's `diff`.
pub fn plan<'a>(routes: impl IntoIterator<Item = (&'a str, bool)>, diff: Diff<'_>) -> Plan {
    let has = |list: &[String], name: &str| list.iter().any(|n| n == name);
    let steps = routes
        .into_iter()
        .map(|(name, running)| {
            let step = match running && !has(diff.changed, name) {
                true => Step::Keep,
                false => Step::Start {
                    added: has(diff.added, name),
                    replaces: running,
                },
            };
            (name.to_string(), step)
        })
        .collect();
    Plan {
        steps,
        retired: diff.removed.to_vec(),
    }
}

/// A route of the new config as the fencing check sees it.
#[derive(Debug, Clone, Copy)]
pub struct Fencing<'a> {
    /// The route.
    pub route: &'a str,
    /// Whether its effects are fenced.
    pub fenced: bool,
    /// Whether a running output stream with fenced effects captures all of its outputs.
    pub captured: bool,
    /// Its allowed outputs.
    pub allowed_outputs: &'a [String],
}

/// The fenced routes that the running output streams cannot fence, one problem each: output
/// streams change only at a restart, so the reload is refused rather than run unfenced.
pub fn unfenced<'a>(routes: impl IntoIterator<Item = Fencing<'a>>) -> Vec<String> {
    routes
        .into_iter()
        .filter(|r| r.fenced && !r.captured)
        .map(|r| format!("route `{}` is fenced, but no running `[[output_streams]]` entry with effects = \"fenced\" captures all of its allowed_outputs {:?}; output streams change only at a restart: restart the hosts with this config instead of reloading", r.route, r.allowed_outputs))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn unchanged_routes_keep_running_and_changed_ones_start_anew() {
        let (added, removed, changed) = (names(&["new"]), names(&["gone"]), names(&["moved"]));
        let diff = Diff {
            added: &added,
            removed: &removed,
            changed: &changed,
        };
        let plan = plan([("same", true), ("moved", true), ("new", false)], diff);
        assert_eq!(
            plan.steps,
            [
                ("same".to_string(), Step::Keep),
                (
                    "moved".to_string(),
                    Step::Start {
                        added: false,
                        replaces: true
                    }
                ),
                (
                    "new".to_string(),
                    Step::Start {
                        added: true,
                        replaces: false
                    }
                ),
            ]
        );
        assert_eq!(plan.retired, ["gone"]);
    }

    #[test]
    fn a_route_not_running_starts_even_when_the_diff_does_not_name_it() {
        // A route the running set lacks (its start failed at the last reload, say) starts.
        let none: Vec<String> = Vec::new();
        let diff = Diff {
            added: &none,
            removed: &none,
            changed: &none,
        };
        assert_eq!(
            plan([("r", false)], diff).steps,
            [(
                "r".to_string(),
                Step::Start {
                    added: false,
                    replaces: false
                }
            )]
        );
    }

    #[test]
    fn only_a_fenced_route_no_running_stream_fences_refuses_the_reload() {
        let outputs = names(&["out.x"]);
        let route = |route, fenced, captured| Fencing {
            route,
            fenced,
            captured,
            allowed_outputs: &outputs,
        };
        let problems = unfenced([
            route("a", true, true),
            route("b", true, false),
            route("c", false, false),
        ]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("route `b` is fenced")
                && problems[0].contains("[\"out.x\"]")
                && problems[0].contains("restart the hosts"),
            "{problems:?}"
        );
    }
}
