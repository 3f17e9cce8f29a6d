//! What a host does with a route once it compared the route's config with the route's contract
//! (DESIGN.md rule 19), and what it does when the contract record changes: plain data in,
//! a decision out. The host's `Live::agrees` and `Live::recheck` (`host/src/serve/live.rs`) act
//! on these decisions over the served set; the simulation's hosts call the same functions.

/// How a route's config compares with the route's contract on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comparison {
    /// The config asks for the recorded contract (or recorded it, the route being new).
    Agrees,
    /// The config asks for another contract than the one recorded.
    Differs,
    /// The contract was deleted and the host does not hold the one its config asks for.
    Deleted,
    /// The contract belongs to another deployment.
    Owned,
    /// The contract was recorded for another deployment's consumer of the same route name.
    OtherConsumer,
    /// A contract change (`setup --change-route`) is under way.
    Changing,
}

/// What a host does with a route after comparing it with its contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agreement {
    /// Serve the route (start it, or keep serving it), with no refusal recorded on it.
    Serve,
    /// Keep serving through a contract change under way: the host has held the route's
    /// serving subscription since before the change's mark, so the change's probe finds it
    /// and refuses while it serves. Its recorded refusal stays as it was.
    KeepServing,
    /// Refuse the route: drain it first when it is served (a contract change waits for the
    /// refusal, so nothing of the old contract still runs when the new one starts
    /// elsewhere), then record why. The reason is an error: only an operator fixes it.
    Refuse {
        /// Whether the route is served now and must drain before the refusal is recorded.
        drain: bool,
    },
    /// Stay out until the contract change under way ends (the record it ends with is checked
    /// again), recording why meanwhile. The reason is a warning: it clears by itself.
    StayOut,
}

/// What a host does with a route whose contract compared as `comparison`, given whether it
/// serves the route now (`serving`).
pub fn decide(comparison: Comparison, serving: bool) -> Agreement {
    match comparison {
        Comparison::Agrees => Agreement::Serve,
        // Only a host not serving yet stays out: one serving is found by the change's probe.
        Comparison::Changing if serving => Agreement::KeepServing,
        Comparison::Changing => Agreement::StayOut,
        Comparison::Differs
        | Comparison::Deleted
        | Comparison::Owned
        | Comparison::OtherConsumer => Agreement::Refuse { drain: serving },
    }
}

impl Agreement {
    /// Whether the route is served after this decision.
    pub fn serves(self) -> bool {
        matches!(self, Agreement::Serve | Agreement::KeepServing)
    }
}

/// What a host does with a route when its contract record changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recheck {
    /// Compare the served route with its contract again ([`decide`]): it stops if it no
    /// longer agrees.
    Agree,
    /// Start the refused route: it is compared as it starts.
    Start,
    /// Leave the route as it is.
    Nothing,
}

/// What a host does with a route whose contract record changed: `served`, whether it serves
/// the route; `refused`, whether the route was refused for its contract; `marked`, whether
/// the record now carries a contract change under way. A refused route whose record was just
/// marked is left alone: trying it would take its serving subscription for a moment, which
/// the change's probe, sent right after the mark, would take for a host serving the route.
/// The record the change ends with is checked in turn.
pub fn recheck(served: bool, refused: bool, marked: bool) -> Recheck {
    if served {
        Recheck::Agree
    } else if refused && !marked {
        Recheck::Start
    } else {
        Recheck::Nothing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFUSALS: [Comparison; 4] = [
        Comparison::Differs,
        Comparison::Deleted,
        Comparison::Owned,
        Comparison::OtherConsumer,
    ];

    #[test]
    fn an_agreeing_route_is_served_whether_or_not_it_was() {
        for serving in [false, true] {
            assert_eq!(decide(Comparison::Agrees, serving), Agreement::Serve);
        }
    }

    #[test]
    fn a_served_route_keeps_serving_while_a_change_is_under_way() {
        assert_eq!(
            decide(Comparison::Changing, true),
            Agreement::KeepServing,
            "the change's probe finds the serving host and refuses"
        );
        assert!(decide(Comparison::Changing, true).serves());
    }

    #[test]
    fn a_route_not_served_stays_out_while_a_change_is_under_way() {
        assert_eq!(decide(Comparison::Changing, false), Agreement::StayOut);
        assert!(!decide(Comparison::Changing, false).serves());
    }

    #[test]
    fn a_refused_route_drains_only_when_it_was_served() {
        for comparison in REFUSALS {
            assert_eq!(
                decide(comparison, true),
                Agreement::Refuse { drain: true },
                "{comparison:?}"
            );
            assert_eq!(
                decide(comparison, false),
                Agreement::Refuse { drain: false },
                "{comparison:?}"
            );
            assert!(!decide(comparison, true).serves());
        }
    }

    #[test]
    fn a_changed_record_rechecks_served_routes_and_starts_refused_ones_unless_marked() {
        for refused in [false, true] {
            for marked in [false, true] {
                assert_eq!(recheck(true, refused, marked), Recheck::Agree);
            }
        }
        assert_eq!(recheck(false, true, false), Recheck::Start);
        assert_eq!(
            recheck(false, true, true),
            Recheck::Nothing,
            "a marked record would meet the change's probe"
        );
        assert_eq!(recheck(false, false, false), Recheck::Nothing);
        assert_eq!(recheck(false, false, true), Recheck::Nothing);
    }
}
