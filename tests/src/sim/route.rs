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
use dedup_host::source_consumer::{self, Settings};
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

/// The duplicate window the host requires of a stream the route publishes to, with the run's
/// `settings`: just over the host's own `Config::longest_rerun_gap` (what `setup` and the
/// config check refuse a shorter window by) of a config with the run's lease, heartbeat,
/// clock skew, ack wait and backoff, parsed by the host's real parser. Computed, not
/// restated: a host that left a term out would make the model's window short, and the
/// simulation would see outputs stored twice.
pub fn required_window_ms(settings: &super::Settings) -> u64 {
    // The gap does not depend on the route's modes; a plain claim-before route has no rule
    // that ties its ack wait to its deadline.
    let host = HostConfig {
        mode: Mode::all()[1],
        partitions: 1,
        host_concurrency: 1,
        route_concurrency: None,
        changed: false,
    };
    let s = settings;
    let timing = format!(
        "[claims]\nlease = \"{}ms\"\nheartbeat = \"{}ms\"\nclock_skew = \"{}ms\"\n[source]\nack_wait = \"{}ms\"\nbackoff = [\"{}ms\"]\nmax_deliver = {}\n",
        s.lease_ms, s.heartbeat_ms, s.skew_ms, s.ack_wait_ms, s.backoff_ms, s.max_deliver
    );
    let toml = host.toml().replacen("[source]\n", &timing, 1);
    let config = Config::parse(&toml, Path::new("sim.toml"), std::env::temp_dir())
        .unwrap_or_else(|e| panic!("the simulation's timing config is valid: {e:#}\n{toml}"));
    config.longest_rerun_gap().as_millis() as u64 + 1
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
            partitions: exclusive::partitions(&config, route),
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
/// the host's `contract::judge`. `held` is the contract the host last agreed on (none after a
/// restart): it keeps serving under it when the record was deleted, if its config still asks
/// for it. The model's contract store answers at once.
pub fn compare(
    world: &Shared,
    served: &Served,
    by: &str,
    held: Option<&RouteContract>,
) -> Comparison {
    let writer = Writer::Host {
        holds_wanted: held == Some(&served.contract),
    };
    settle(world, served, by, writer)
}

/// An operator's `dedup-host setup` with `served`'s config: records the route's contract
/// when it was deleted (or never recorded), else judges the record found.
pub fn setup(world: &Shared, served: &Served) -> Comparison {
    settle(world, served, "setup", Writer::Setup)
}

fn settle(world: &Shared, served: &Served, by: &str, writer: Writer) -> Comparison {
    let route = &served.config.routes[0];
    let now = world.lock().expect("one thread").now;
    let new = || ContractRecord {
        // The model's time, not the machine's: a seed replays the same records.
        recorded_ms: now,
        ..ContractRecord::new(served.contract.clone(), by, &served.config, route)
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

/// The settings a host's re-bind of the route's source consumer (after a pull error) writes
/// over `have`, the consumer's on the model server, as `pipeline/consume.rs` binds: whether
/// it is an exclusive route's ([`source_consumer::binds_exclusive`], from `served` or from
/// `started`, the config the host started with), what that config asks of it
/// ([`source_consumer::Settings::wanted`], from `started`: a host's `Shared.config`), and
/// what a host's bind keeps of what exists ([`source_consumer::to_write`]).
pub fn rebind(started: &HostConfig, served: &Served, have: &Settings) -> Settings {
    let config = started.config();
    let route = &served.config.routes[0];
    let queue =
        source_consumer::binds_exclusive(&config, &route.name, route.exclusive_by.is_some());
    let wanted = Settings::wanted(&config, vec![route.subject.clone()], queue);
    source_consumer::to_write(source_consumer::Writer::Host, Some(have), &wanted, queue)
}

/// The source consumer's settings as `setup` writes them for `host`'s config of the route
/// ([`source_consumer::Settings::wanted`]), but with the model's ack wait and delivery bound
/// (the model's configs leave `source.ack_wait` and `source.server_max_deliver` at their
/// defaults): an exclusive route's hands out one message at a time, with the order ack wait.
pub fn set_up_consumer(host: &HostConfig, ack_wait_ms: u64, max_deliver: u64) -> Settings {
    let config = host.config();
    let route = &config.routes[0];
    let exclusive = route.exclusive_by.is_some();
    let mut s = Settings::wanted(&config, vec![route.subject.clone()], exclusive);
    if !exclusive {
        s.ack_wait = std::time::Duration::from_millis(ack_wait_ms);
    }
    s.max_deliver = max_deliver as i64;
    s
}
