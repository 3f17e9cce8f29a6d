//! Renaming a route: `dedup-host setup --rename-route OLD NEW`. A route's name is in its
//! consumer's name, its claim keys, its output ids and its contract's key, so a route that
//! only changed its name in the config would start over: a new consumer from the first
//! retained message, no claims, a new contract. This carries everything over instead, with
//! no host serving the old name:
//! 1. checks everything first (the config names `NEW` and not `OLD`; `OLD`'s consumer and
//!    contract exist and belong to this deployment; nothing of `NEW` exists yet; `NEW`'s
//!    settings match `OLD`'s contract and its subject `OLD`'s consumer's filter; no live host
//!    serves `OLD`; none of `OLD`'s keys is unsettled: a key in progress, or failed and due
//!    again, may have published part of its outputs under ids derived from `OLD`, which a
//!    run under `NEW` would publish again under other ids; on a claim-after route, whose
//!    runs publish before they record the key, `OLD`'s consumer has no delivery pending and
//!    the server gave up on no message of `OLD` not dead-lettered yet (a stranded-message
//!    marker stands for none, [`rename::given_up_refuses`]);
//! 2. copies `OLD`'s claim records to `NEW`'s keys in the same claim store (bucket or fenced
//!    stream), so a key settled under the old name is not run again, each with its journal of
//!    outbound calls, so a key run again under `NEW` (its dead letter replayed) replays the
//!    answers recorded under `OLD` instead of sending those calls again; each record keeps
//!    the old claim key in `outputs_as` (its outputs' ids) and `calls_as` (its calls'
//!    idempotency keys, so a call sent again under `NEW` carries the key the provider saw),
//!    which is also how a replay of a letter of `OLD` finds `NEW` ([`crate::ops::renamed`]);
//! 3. records `OLD`'s contract under `NEW`;
//! 4. creates `NEW`'s consumer from the first message `OLD`'s consumer had not acknowledged
//!    (its ack floor + 1: anything acked after the floor finds its copied claim and is acked
//!    without running; on a claim-after route, after the last message it delivered, where it
//!    would go on, so a message the server gave up on is not delivered again under `NEW`),
//!    then deletes `OLD`'s consumer and contract;
//! 5. copies `OLD`'s deployed component to `NEW` (when `NEW` has none), recording this
//!    deployment and `NEW`'s consumer as its deployer, so hosts serve `NEW` at once.

use anyhow::Context as _;
use async_nats::jetstream::Context;
use dedup_delivery::rename;
use serde::Serialize;

use crate::config::Config;
use crate::contract::{self, ContractRecord};
use crate::contract_change::{
    copy_record, dead_with_effects, plan_calls, read_records, refuse_running, refuse_while_served,
    store_key, stranded_of, AcceptedDead, CallsMove, Lease,
};
use crate::setup::route_consumer_name;

/// What a rename did.
#[derive(Debug, Clone, Serialize)]
pub struct Renamed {
    /// The old route name.
    pub from: String,
    /// The new route name.
    pub to: String,
    /// Claim records copied to the new name.
    pub claims_copied: usize,
    /// Outbound-call journal records copied with them (or deletion markers over records the
    /// new name kept from an earlier life).
    pub calls_copied: usize,
    /// The stream sequence the new consumer starts at.
    pub starts_at: u64,
    /// The digest of `from`'s deployed component, copied to `to` (`None`: none was deployed,
    /// or `to` had one already).
    pub component: Option<String>,
}

/// Renames route `old` to `new` (see the module documentation); keys in `accepted` are
/// taken as settled though dead-lettered after their outputs (they move as they are).
pub async fn rename(
    js: &Context,
    config: &Config,
    old: &str,
    new: &str,
    accepted: &AcceptedDead,
) -> anyhow::Result<Renamed> {
    let fix = format!("`dedup-host setup --rename-route {old} {new}`");
    let route = config.routes.iter().find(|r| r.name == new).with_context(|| {
        format!("route `{new}` is not in this config: {fix} takes the config that names the route `{new}`")
    })?;
    anyhow::ensure!(
        !config.routes.iter().any(|r| r.name == old),
        "this config still names route `{old}`: rename it to `{new}` in the config first"
    );
    anyhow::ensure!(
        route.exclusive_by.is_none(),
        "route `{new}` is exclusive: its queue partitions are named after the route and are not carried over; keep the name `{old}`"
    );
    let mine = config.deployment_name();
    let source = js
        .get_stream(&config.source.stream)
        .await
        .with_context(|| format!("no source stream `{}`", config.source.stream))?;
    let (old_consumer, new_consumer) = (
        route_consumer_name(config, old),
        route_consumer_name(config, new),
    );
    let info = source.consumer_info(&old_consumer).await.with_context(|| {
        format!(
            "no consumer `{old_consumer}` of route `{old}` on stream `{}`: nothing to rename",
            config.source.stream
        )
    })?;
    owned(
        "consumer",
        &old_consumer,
        crate::ownership::owner(&info.config.metadata),
        &mine,
    )?;
    let filters = match info.config.filter_subjects.as_slice() {
        [] => vec![info.config.filter_subject.clone()],
        many => many.to_vec(),
    };
    anyhow::ensure!(
        filters == [route.subject.clone()],
        "route `{new}` consumes `{}`, but route `{old}`'s consumer `{old_consumer}` takes {}: a rename keeps the subject (the new consumer starts where the old one stopped, so the old subject's waiting messages would never run and the new one's earlier messages would be skipped); rename with `subject = \"{}\"`, then change the subject with a plain `dedup-host setup`",
        route.subject,
        filters.join(", "),
        filters.join(", ")
    );
    anyhow::ensure!(
        source.consumer_info(&new_consumer).await.is_err(),
        "consumer `{new_consumer}` of route `{new}` exists already: the route has started under its new name; delete that consumer to rename over it"
    );
    let store = contract::open(js, config).await?;
    let (recorded, revision) = contract::read(&store, old).await?.with_context(|| {
        format!(
            "route `{old}` has no contract in `{}`: nothing to rename",
            store.name
        )
    })?;
    let live = recorded.clone().with_live_subjects(js, config).await;
    owned(
        "contract",
        &format!("{}/{old}", store.name),
        // A former default name of this deployment (same route consumer, same subject) is
        // its own.
        live.other_owner(config, old),
        &mine,
    )?;
    anyhow::ensure!(
        contract::read(&store, new).await?.is_none(),
        "route `{new}` has a contract in `{}` already: delete key `{new}` there to rename over it",
        store.name
    );
    let differences = contract::differences(&recorded.contract, &contract::of(config, route));
    anyhow::ensure!(
        differences.is_empty(),
        "route `{new}` differs from route `{old}`'s contract ({}): rename with the old settings, then change them with `--change-route {new}`",
        differences.join("; ")
    );
    // Marked before the probe, as a contract change is: a host that starts `old` after the
    // probe reads the mark (it reads the record after taking its serving subscription) and
    // does not start the route.
    // A mark an earlier change or rename left stays after a refusal (its lease released): it
    // may have moved part of what it moves.
    let earlier = contract::lookup_marked(&store, old).await?.1;
    // A live run of another change or rename of the route is moving it: refused, named.
    refuse_running(config, &store, old, earlier.as_ref())?;
    let since = (earlier.as_ref()).map_or_else(crate::claim::record::now_ms, |m| m.since_ms);
    let taken = (recorded.contract.clone(), since);
    let mut lease = Lease::take(config, &store, old, &recorded, taken, revision).await?;
    let claims = &recorded.contract.claims;
    let claim_store = crate::fenced::host_store(js, config).await?;
    let checked = async {
        refuse_while_served(js, config, old).await?;
        // Read now that no host serves `old`, and before its records: a claim-after run may
        // have published without a record yet, and a host's marker sweep writes a given-up
        // message's record before it removes the marker, so a marker gone by now left a
        // record the read below finds. The consumer's position, read here, is where the new
        // consumer starts ([`rename::start`]).
        let latest = (source.consumer_info(&old_consumer).await)
            .with_context(|| format!("cannot read consumer `{old_consumer}` of route `{old}`"))?;
        let pending = latest.num_ack_pending as u64;
        let claim_after = route.claim == crate::config::ClaimMode::After;
        if rename::pending_refuses(claim_after, pending) {
            return Err(RenameRefused::Pending {
                old: old.to_string(),
                new: new.to_string(),
                consumer: old_consumer.clone(),
                count: pending,
            }
            .into());
        }
        let consumer = rename::OldConsumer {
            ack_floor: latest.ack_floor.stream_sequence,
            delivered: latest.delivered.stream_sequence,
            ack_pending: pending,
        };
        let takes = |subject: &str| crate::subject::matches(&route.subject, subject);
        let marked = match claim_after {
            true => stranded_of(js, config, &source, &takes).await?,
            false => Vec::new(),
        };
        if let Some(given_up) = rename::given_up_refuses(claim_after, &marked) {
            return Err(RenameRefused::GivenUp {
                old: old.to_string(),
                new: new.to_string(),
                stream: config.source.stream.clone(),
                given_up,
            }
            .into());
        }
        let records = read_records(js, &claim_store, claims, old, &mut lease).await?;
        accepted.check(old, &records)?;
        refuse_unsettled(old, new, &records, accepted)?;
        let mut journals = Vec::new();
        for (key, _) in &records {
            lease.keep().await?;
            let renamed = rename::renamed_key(old, new, key);
            // The same store: a record there fits.
            let journal = plan_calls(js, (claims, key), (claims, &renamed), None).await?;
            journals.push(journal.unwrap_or_else(|_| CallsMove::default()));
        }
        anyhow::Ok((records, journals, rename::start(consumer, claim_after)))
    }
    .await;
    let clear_with = format!("clear it with `dedup-host setup --config <the config that names {old}> --change-route {old}`, or run {fix} again");
    let (records, journals, start) = match checked {
        Ok(checked) => checked,
        Err(e)
            if e.chain()
                .any(|c| c.is::<crate::contract_change::LeaseLost>()) =>
        {
            return Err(e)
        }
        // A mark an earlier run left stays (released): it may have moved part of the claims.
        Err(e) if earlier.is_some() => {
            lease.release().await;
            return Err(e);
        }
        // Refused, or a check that could not finish: nothing moved yet, so this run's mark
        // goes.
        Err(e) => {
            return Err(match lease.clear().await {
                Ok(()) => e,
                Err(u) => e.context(format!("cannot clear route `{old}`'s changing mark ({u}): hosts do not start `{old}` while it is there; {clear_with}")),
            });
        }
    };
    let (mut claims_copied, mut calls_copied) = (0, 0);
    for ((key, record), journal) in records.into_iter().zip(journals) {
        lease.keep().await?;
        let renamed = rename::renamed_key(old, new, &key);
        // Its outputs keep the ids they were published under (`audit`, `inspect`), its
        // outbound calls their idempotency keys (rule 24): a call left PENDING under the old
        // name is sent again under the key the provider saw.
        let Some(mut record) = rename::carried(record, &key) else {
            continue;
        };
        // An accepted dead key is marked: a replay of its letter is refused unless forced.
        if dead_with_effects(&record) && accepted.accepts(old, &key) {
            record.accept_dead(&format!("setup --rename-route {old} {new}"));
        }
        // The journal first: a claim copied without it would send its calls again.
        if let Err(e) = journal.apply(js).await {
            lease.release().await;
            return Err(e.context(format!("copying a claim's call journal to the new route name stopped the rename: route `{old}` stays marked as changing, its lease released; {clear_with}")));
        }
        calls_copied += journal.len();
        // A record `new` kept from an earlier life of that name does not shadow a newer one.
        // Copied as listed, not fenced in `old`'s key first as `--change-route` fences
        // (`change::fence`): no late write can move a record copied here. That change met
        // the race (a draining host's unanswered write landing after the copy) because it
        // copies open records too; a rename copies only records listed settled (any key in
        // progress, or failed and due again, refused it above), and every host write of a
        // claim record is a create (expecting no record) or a compare-and-swap at the revision
        // its writer read, and none is made over a settled record: a claim, a claim-after
        // settle or mark finds it completed or dead-lettered and writes nothing
        // (`Claimer::claim_message`, `after::unsettled`), and the undeliverable sweep drops
        // the message of such a key (`undeliverable::decide`); the one settled record a host
        // claims over, a coalesced one, is an exclusive route's, which is never renamed. So a
        // write still on its way from a host that served `old` (paused, or its answer lost)
        // expects an older revision and is refused; and it writes `old`'s key, never the
        // renamed one, though both are in the same store. A late create of a key listed
        // without a record lands under `old`, which nothing reads after the rename: a
        // claim-after delivery that wrote it is still pending or given up (refused above),
        // and a claim-before host whose claim's answer was lost gave the claim up, having run
        // nothing (a host still running under `old` is what `refuse_while_served` rules out,
        // as for the change).
        let copied = match copy_record(&claim_store, &store_key(claims, &renamed), &record).await {
            Ok(copied) => copied,
            Err(e) => {
                lease.release().await;
                return Err(e.context(format!("copying a claim record to the new route name stopped the rename: route `{old}` stays marked as changing, its lease released; {clear_with}")));
            }
        };
        lease.moved();
        if copied {
            claims_copied += 1;
        }
    }
    let record = ContractRecord {
        recorded_by: format!("setup --rename-route {old} {new}"),
        recorded_ms: crate::claim::record::now_ms(),
        deployment: Some(mine),
        consumer: Some(crate::consumers::route_consumer_name(config, new)),
        subjects: Some(vec![route.subject.clone()]),
        ..recorded
    };
    let bytes = serde_json::to_vec(&record).expect("record serializes");
    store
        .create(new, bytes.into())
        .await
        .with_context(|| format!("cannot record route `{new}`'s contract"))?;
    // From the first message the old consumer had not acknowledged (its ack floor + 1), or
    // on a claim-after route from where it would go on.
    let starts_at = start.unwrap_or(1);
    crate::setup::create_consumer_at(
        &source,
        config,
        &new_consumer,
        vec![route.subject.clone()],
        false,
        start,
    )
    .await?;
    source
        .delete_consumer(&old_consumer)
        .await
        .with_context(|| {
            format!("cannot delete the old consumer `{old_consumer}`: delete it by hand")
        })?;
    store.purge(old).await.with_context(|| {
        format!(
            "cannot delete route `{old}`'s contract: delete key `{old}` of `{}` by hand",
            store.name
        )
    })?;
    let component = carry_component(js, config, old, new)
        .await
        .with_context(|| format!("route `{old}` was renamed to `{new}`, but its component was not copied: deploy it with `dedup-host deploy --route {new} --component <file>`"))?;
    Ok(Renamed {
        from: old.to_string(),
        to: new.to_string(),
        claims_copied,
        calls_copied,
        starts_at,
        component,
    })
}

/// Copies route `old`'s deployed component to `new` when `new` has none and `old`'s was
/// deployed by this config's route consumer (or before deployers were recorded), recorded
/// as deployed by `new`'s: its digest, or `None` when nothing was copied.
async fn carry_component(
    js: &Context,
    config: &Config,
    old: &str,
    new: &str,
) -> anyhow::Result<Option<String>> {
    use crate::components::store;
    let Ok(objects) = js.get_object_store(&config.components.bucket).await else {
        return Ok(None);
    };
    let Some(deployer) = store::deployer(&objects, old).await else {
        return Ok(None);
    };
    let mine = route_consumer_name(config, old);
    if deployer.consumer.as_ref().is_some_and(|c| *c != mine)
        || store::deployed(&objects, new).await.is_some()
    {
        return Ok(None);
    }
    let bytes = crate::objects::read(&objects, old).await?;
    let digest = store::deploy_by(&objects, new, &bytes, &store::Deployer::of(config, new)).await?;
    Ok(Some(digest))
}

/// Refuses a rename while a key of `old` is unsettled (in progress, or failed and due again):
/// it may have published part of its outputs under ids derived from `old`, and its next run,
/// under `new`, would publish them again under other ids.
fn refuse_unsettled(
    old: &str,
    new: &str,
    records: &[(String, crate::claim::ClaimRecord)],
    accepted: &AcceptedDead,
) -> anyhow::Result<()> {
    let unsettled: Vec<&str> = records
        .iter()
        // Dead-lettered after outputs may have been stored: a replay under `new` would publish
        // them again under other ids. The operator may accept such a key (`--accept-dead`): it
        // can never complete.
        .filter(|(key, r)| rename::unsettled(r, accepted.accepts(old, key)))
        .map(|(key, _)| key.as_str())
        .collect();
    if unsettled.is_empty() {
        return Ok(());
    }
    const SHOWN: usize = 10;
    let more = unsettled.len().saturating_sub(SHOWN);
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    Err(RenameRefused::Unsettled {
        old: old.to_string(),
        new: new.to_string(),
        count: unsettled.len(),
        keys: format!(
            "{}{more}",
            unsettled[..unsettled.len().min(SHOWN)].join(", ")
        ),
    }
    .into())
}

/// Why a rename was refused after checking the server; nothing was changed.
#[derive(Debug, thiserror::Error)]
pub enum RenameRefused {
    /// A claim-after route's consumer has deliveries not acknowledged
    /// ([`dedup_delivery::rename::pending_refuses`]).
    #[error("route `{old}` claims after its run, and its consumer `{consumer}` has {count} message(s) delivered and not acknowledged: a run may have published their outputs under ids of `{old}` before recording the key, and under `{new}` it would publish them again under other ids; run a host with the config that still names `{old}` until the consumer has none pending (`nats consumer info` shows `Outstanding Acks: 0`), stop it, then run `dedup-host setup --rename-route {old} {new}` again")]
    Pending {
        /// The old route name.
        old: String,
        /// The new route name.
        new: String,
        /// The old route's consumer.
        consumer: String,
        /// How many deliveries are not acknowledged.
        count: u64,
    },
    /// A claim-after route's server gave up on messages not dead-lettered yet
    /// ([`dedup_delivery::rename::given_up_refuses`]).
    #[error("route `{old}` claims after its run, and {}; run a host with the config that still names `{old}` until its marker sweep has dead-lettered them under `{old}` (`dedup-host audit` lists each as `not_dead_lettered`, with why its letter is not stored yet, e.g. a missing dead-letter stream), replay their letters until they complete (`dedup-host dead-letters replay --route {old} --all`; a dead-lettered key that can never complete may instead be accepted with `--accept-dead <key>`), stop it, then run `dedup-host setup --rename-route {old} {new}` again", given_up_what(.given_up, .stream, .old, .new))]
    GivenUp {
        /// The old route name.
        old: String,
        /// The new route name.
        new: String,
        /// The source stream.
        stream: String,
        /// What shows the messages given up on.
        given_up: rename::GivenUp,
    },
    /// Keys of the old route are not settled ([`refuse_unsettled`]).
    #[error("route `{old}` has {count} unsettled claim key(s) ({keys}): in progress, due again, or dead-lettered after publishing, they may have published outputs under ids of `{old}`, which a run (or a dead letter's replay) under `{new}` would publish again; run a host with the config that still names `{old}` until they settle (completed, or dead-lettered before any output; replay the letters of the others with `dedup-host dead-letters replay --route {old} --all` until they complete; `dedup-host inspect --route {old} --key <key>` shows one), stop it, then run `dedup-host setup --rename-route {old} {new}` again; a dead-lettered key that can never complete may be accepted as settled with `--accept-dead <key>` (repeatable): it moves as it is, still dead-lettered and marked as accepted, and `dead-letters replay` then refuses its letter unless `--force`")]
    Unsettled {
        /// The old route name.
        old: String,
        /// The new route name.
        new: String,
        /// How many keys are unsettled.
        count: usize,
        /// The first of them, and how many more.
        keys: String,
    },
}

/// What a [`RenameRefused::GivenUp`] saw, and why it refuses.
fn given_up_what(given_up: &rename::GivenUp, stream: &str, old: &str, new: &str) -> String {
    let rename::GivenUp::Marked(sequences) = given_up;
    format!(
        "the server gave up on message(s) {} of stream `{stream}` that it consumes, not dead-lettered yet (stranded-message marker(s) `{}.<sequence>.<consumer>` stand for them in the claim bucket): a run of one may have published part of its outputs under ids of `{old}` and left no claim record, so nothing of its key is carried, and under `{new}` the hosts' marker sweep would dead-letter it and a replay of the letter would run it, publishing those outputs again under other ids",
        sequences.iter().map(u64::to_string).collect::<Vec<_>>().join(", "),
        crate::stranded::PREFIX.to_string() + "." + stream,
    )
}

/// Refuses what another deployment owns (something without an owner is this deployment's).
fn owned(kind: &'static str, name: &str, owner: Option<&str>, mine: &str) -> anyhow::Result<()> {
    match owner {
        Some(owner) if owner != mine => Err(crate::ownership::Conflict::Owned {
            kind,
            name: name.to_string(),
            owner: owner.to_string(),
            mine: mine.to_string(),
            would: "rename it".into(),
            route: None,
        }
        .into()),
        _ => Ok(()),
    }
}
