//! The route every simulated host serves, as each host's own config describes it. Configs are
//! parsed by the host's real parser, and what a host does with one comes from the host's real
//! functions: where the claims live and the route's contract ([`contract::of`]), its partition
//! count ([`exclusive::partitions`]), the work subject of an entity
//! ([`exclusive::work_subject`]) and how its config compares with the route's contract
//! ([`compare`]: the host's record-or-read step and judgement).
//! Hosts differ in size (host and route concurrency), and a reload or a rolling restart can
//! bring a changed route: that is where findings 1 and 2 of issue 25 lived.

use std::path::Path;

use dedup_delivery::agreement::Comparison;
use dedup_delivery::contract::Writer;
use dedup_host::config::Config;
use dedup_host::contract::{self, ContractRecord, RouteContract};
use dedup_host::exclusive;
use futures::FutureExt as _;

use super::store::{Shared, SimContracts};

/// The delivery modes of a run: every host starts with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    /// `claim = "after"` (window effects, not exclusive).
    pub claim_after: bool,
    /// `effects = "fenced"`: claims and outputs in one stream, written together.
    pub fenced: bool,
    /// `exclusive_by`: one message of an entity at a time, in source order.
    pub exclusive: bool,
    /// `coalesce` (exclusive only): skip a message whose entity has a newer one waiting.
    pub coalesce: bool,
}

impl Mode {
    /// Every combination the config allows (claim-after is neither fenced nor exclusive).
    pub fn all() -> Vec<Mode> {
        let mut modes = vec![Mode {
            claim_after: true,
            fenced: false,
            exclusive: false,
            coalesce: false,
        }];
        for fenced in [false, true] {
            for (exclusive, coalesce) in [(false, false), (true, false), (true, true)] {
                modes.push(Mode {
                    claim_after: false,
                    fenced,
                    exclusive,
                    coalesce,
                });
            }
        }
        modes
    }

    /// The flags that replay a run of this mode with `simulate`.
    pub fn flags(&self) -> String {
        let mut flags = String::new();
        for (on, flag) in [
            (self.claim_after, " --claim-after"),
            (self.fenced, " --fenced"),
            (self.exclusive && !self.coalesce, " --exclusive"),
            (self.coalesce, " --coalesce"),
        ] {
            if on {
                flags.push_str(flag);
            }
        }
        flags
    }
}

/// One host's config of the route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostConfig {
    /// The run's modes.
    pub mode: Mode,
    /// The route's `partitions` setting (exclusive routes).
    pub partitions: usize,
    /// The host's `[host] concurrency`: its size.
    pub host_concurrency: usize,
    /// The route's `concurrency` on this host, if set.
    pub route_concurrency: Option<usize>,
    /// Changed by a reload or a rolling restart (see [`HostConfig::changed`]).
    pub changed: bool,
}

impl HostConfig {
    /// The config text: fenced routes write to `out.r`, captured by the fenced stream `OUT`.
    fn toml(&self) -> String {
        let m = self.mode;
        // The change an operator makes by reload: an exclusive route changes its partitions;
        // a fenced route turns window (its claims would move to the bucket, finding 2), a
        // window route fenced; a claim-after route claims before. (A fenced route gaining an
        // output no fenced stream captures is refused by the config check itself.)
        let (fenced, claim_after, partitions) = match self.changed {
            false => (m.fenced, m.claim_after, self.partitions),
            true if m.exclusive => (m.fenced, false, self.partitions + 1),
            true if m.claim_after => (false, false, self.partitions),
            true => (!m.fenced, false, self.partitions),
        };
        let mut route = String::from("[[routes]]\nname = \"r\"\nsubject = \"in.r.*\"\n");
        route.push_str("allowed_outputs = [\"out.r\"]\n");
        if fenced {
            route.push_str("effects = \"fenced\"\n");
        }
        if claim_after {
            route.push_str("claim = \"after\"\n");
        }
        if m.exclusive {
            route.push_str(&format!(
                "exclusive_by = {{ subject_token = 2 }}\npartitions = {partitions}\n"
            ));
        }
        if m.coalesce {
            route.push_str("coalesce = true\n");
        }
        route.push_str("limits = { deadline = \"2s\" }\n");
        if let Some(c) = self.route_concurrency {
            route.push_str(&format!("concurrency = {c}\n"));
        }
        format!(
            "[nats]\nurls = [\"nats://127.0.0.1:4222\"]\n[host]\nconcurrency = {}\nmax_in_flight = {}\n[source]\nsubjects = [\"in.>\"]\n[[output_streams]]\nname = \"OUT\"\nsubjects = [\"out.>\"]\neffects = \"fenced\"\n{route}",
            self.host_concurrency,
            self.host_concurrency.max(self.route_concurrency.unwrap_or(1)) * 4,
        )
    }

    /// The parsed config.
    pub fn config(&self) -> Config {
        Config::parse(&self.toml(), Path::new("sim.toml"), std::env::temp_dir())
            .unwrap_or_else(|e| panic!("the simulation's config is valid: {e:#}\n{}", self.toml()))
    }
}

/// What a host does with its config of the route.
#[derive(Debug, Clone)]
pub struct Served {
    /// The route's contract as this config has it.
    pub contract: RouteContract,
    /// Claims in the fenced stream (beside the outputs, committed with them), not the bucket.
    pub fenced: bool,
    /// Claim after running.
    pub claim_after: bool,
    /// The partitions this host queues to and pulls (exclusive routes).
    pub partitions: usize,
    config: Config,
}

impl Served {
    /// What `host` does with its config.
    pub fn new(host: &HostConfig) -> Self {
        let config = host.config();
        let route = &config.routes[0];
        let contract = contract::of(&config, route);
        Self {
            fenced: contract.claims.starts_with("stream "),
            claim_after: route.claim == dedup_host::config::ClaimMode::After,
            partitions: exclusive::partitions(route),
            contract,
            config,
        }
    }

    /// Where a message of `entity` is queued: its partition (the subject's partition token).
    pub fn partition_of(&self, entity: &str) -> usize {
        let subject = exclusive::work_subject(&self.config, "r", self.partitions, entity);
        let token = subject.rsplit('.').nth(1).expect("a partition token");
        token.parse().expect("a partition number")
    }
}

/// How `served` compares with the route's contract, read from the model server or recorded
/// there when the route has none, as a serving host does it: the host's own
/// `dedup_delivery::contract::settle` over the model's [`SimContracts`], the record judged by
/// the host's `contract::judge`. The model's contract store answers at once.
pub fn compare(world: &Shared, served: &Served, by: &str) -> Comparison {
    let route = &served.config.routes[0];
    let now = world.lock().expect("one thread").now;
    let new = || ContractRecord {
        // The model's time, not the machine's: a seed replays the same records.
        recorded_ms: now,
        ..ContractRecord::new(served.contract.clone(), by, &served.config, route)
    };
    // The model holds no contract a host agreed on before and deletes none.
    let writer = Writer::Host {
        holds_wanted: false,
    };
    let store = SimContracts {
        world: world.clone(),
    };
    let settled = dedup_delivery::contract::settle(&store, &route.name, writer, new)
        .now_or_never()
        .expect("the model's contract store answers at once");
    let settled = settled.unwrap_or_else(|never| match never {});
    let bucket = contract::bucket_name(&served.config);
    let judge = |recorded: &ContractRecord| {
        contract::judge(&bucket, &served.config, route, recorded, &served.contract)
            .map_err(|e| e.comparison().expect("a judgement is a comparison"))
    };
    settled
        .verdict(judge)
        .comparison()
        .expect("the model's contract store always settles")
}
