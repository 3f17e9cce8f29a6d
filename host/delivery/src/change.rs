//! The decisions of a contract change (`dedup-host setup --change-route`, issue 42 finding 7):
//! what a run does with the route's record (record it, call a stopped change off, change it),
//! when the hosts have drained the route (the evidence that one still serves it), which claim
//! records move from the old contract's claim store to the new one and how each is written,
//! and what a run that stopped leaves behind. The host runs them over async-nats
//! (`host/src/contract_change.rs`), the simulation over its model server
//! (`tests/src/sim/host/change.rs`), both through [`Stores`].
//!
//! Each record is fenced in the old store before it is copied ([`fence`]: written again at
//! the revision read), so a write a draining host sent there before it stopped, landing late,
//! is refused instead of changing a key already moved.
//!
//! Every record moves, settled or not, between any two stores (the bucket and a fenced stream,
//! or two buckets): a key settled before the change is a duplicate after it, and a key still
//! open keeps its attempts. Window to fenced is refused while a key is not settled, or
//! failed for good after it may have stored outputs ([`Refused`]): its window outputs may be
//! stored, and a fenced run would publish them again without message ids.

use std::future::Future;

use crate::claim::record::{ClaimRecord, ClaimState};
use crate::claim::store::{ClaimError, ClaimStore};
use crate::revert::{self, Fix};

/// What a run of the change does with the route's recorded contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Run {
    /// No contract is recorded (never, deleted or unreadable): record this config's.
    Record,
    /// The record already holds this config's contract and no change is under way.
    Unchanged,
    /// The record holds this config's contract and carries the mark of a change that
    /// stopped part-way: call it off (put back what moved, clear the mark).
    CallOff,
    /// The record holds another contract: change it (a rerun finishes a stopped change).
    Change,
}

/// What a run does: `recorded` whether a contract is recorded, `same` whether it is this
/// config's, `marked` whether the record carries a change's mark.
pub fn run(recorded: bool, same: bool, marked: bool) -> Run {
    match (recorded, same, marked) {
        (false, _, _) => Run::Record,
        (true, true, false) => Run::Unchanged,
        (true, true, true) => Run::CallOff,
        (true, false, _) => Run::Change,
    }
}

/// Whether the old contract's open deliveries keep a change from going ahead: from claim
/// after (`from_after`) to claim before (`to_after` false) while `open` messages of the old
/// contract are not settled: delivered and not acknowledged (the consumer's
/// `num_ack_pending`), or given up by the server and not dead-lettered yet (a
/// stranded-message marker stands; once lettered, a claim-after key is recorded as one whose
/// outputs may be stored, which [`plan`] weighs). A claim-after run publishes before it
/// records its key, so such a message may have published outputs with no record to show it
/// (its settled write unanswered, or its host stopped between the two); under claim before
/// its next delivery (or its letter's replay) would claim the key as new, naming the version
/// that runs then as the one that began effects it did not begin (the simulation's seed 26406
/// `--claim-after`: a version promoted meanwhile), or, with fenced effects, publish its
/// outputs again without message ids. Between two claim-after contracts the message runs again
/// as the old contract would run it. The rename refuses on the same grounds
/// ([`crate::rename::pending_refuses`]).
pub fn open_refuses(from_after: bool, to_after: bool, open: u64) -> bool {
    from_after && !to_after && open > 0 && !revert::reverted(Fix::ChangeWaitsForClaimAfter)
}

/// What a run that stopped with an error leaves of its mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Another run took the mark over: it is that run's.
    Leave,
    /// Cleared: the run was refused before it moved anything and the mark was its own.
    Clear,
    /// Left, with its lease released, for the next run to finish the change or call it off.
    Release,
}

/// What a stopped run does with its mark: `lost` whether it lost the mark to another run,
/// `refused` whether it was refused before moving anything, `first` whether it marked the
/// record itself (no earlier run left a mark, which may have moved part of the queue).
pub fn stop(lost: bool, refused: bool, first: bool) -> Stop {
    match (lost, refused && first) {
        (true, _) => Stop::Leave,
        (false, true) => Stop::Clear,
        (false, false) => Stop::Release,
    }
}

/// The evidence that a host still serves the route, one line per host: the host that answered
/// the route's serving probe (`answered`), and those whose status record shows the route
/// served and not refused (`status`, whatever the record's age). Each host is named once, with
/// every fact about it. Empty: the hosts have drained the route, and the change may move it.
pub fn evidence(answered: Option<&str>, status: &[String]) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(host) = answered {
        let also = if status.iter().any(|h| h == host) {
            " and its status says so"
        } else {
            ""
        };
        lines.push(format!("host `{host}` answered that it serves it{also}"));
    }
    for host in status.iter().filter(|h| Some(h.as_str()) != answered) {
        lines.push(format!("host `{host}`'s status says it serves it"));
    }
    lines
}

/// Whether a record is final: completed, or failed for good.
pub fn settled(record: &ClaimRecord) -> bool {
    record.state == ClaimState::Completed
        || (record.state == ClaimState::Failed && record.permanent)
}

/// Whether a key failed for good (dead-lettered) after its window outputs may have been
/// stored: a replay of its dead letter runs it again, and must do so where those outputs'
/// message ids still deduplicate.
pub fn dead_with_effects(record: &ClaimRecord) -> bool {
    record.state == ClaimState::Failed && record.permanent && record.may_have_effects()
}

/// Why the claim records of a route were not moved: nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Window to fenced with keys not settled, whose window outputs may be stored.
    #[error("{count} key(s) are not settled under the window contract, e.g. {keys:?}")]
    Unsettled {
        /// How many keys are open.
        count: usize,
        /// The first ten of them.
        keys: Vec<String>,
    },
    /// Window to fenced with keys dead-lettered after their window outputs may have been
    /// stored, and not accepted as settled.
    #[error("{count} key(s) failed for good after their window outputs may have been stored, e.g. {keys:?}")]
    DeadWithEffects {
        /// How many keys.
        count: usize,
        /// The first ten of them.
        keys: Vec<String>,
    },
}

/// One claim record to write to the new store.
#[derive(Debug, Clone, PartialEq)]
pub struct Copy {
    /// Its claim key.
    pub key: String,
    /// The record to write: as read, marked as accepted when `accepted`.
    pub record: ClaimRecord,
    /// Dead-lettered after its outputs, accepted as settled by the operator.
    pub accepted: bool,
}

/// The claims of a move: the stores' names as a contract names them (`bucket <name>` or
/// `stream <name>`), old and new, and whether the effects go from window to fenced.
#[derive(Debug, Clone, Copy)]
pub struct Claims<'a> {
    /// Where the recorded contract keeps its claims.
    pub from: &'a str,
    /// Where the new contract keeps them.
    pub to: &'a str,
    /// The recorded contract's effects are window and the new one's fenced.
    pub window_to_fenced: bool,
}

/// Which of `records` (every claim record of the route in the old store) to copy, and how:
/// each one, those of keys `accepts` names (dead-lettered after their outputs) marked as
/// accepted by `by` ([`ClaimRecord::accept_dead`]). Refused, copying nothing, when the effects
/// go from window to fenced while a key is not settled, or is dead-lettered after its outputs
/// and not accepted.
pub fn plan(
    records: Vec<(String, ClaimRecord)>,
    claims: Claims<'_>,
    accepts: &dyn Fn(&str) -> bool,
    by: &str,
) -> Result<Vec<Copy>, Refused> {
    if revert::reverted(Fix::ChangeMovesClaims) {
        // Before: read through the new contract's bucket (nothing found across buckets),
        // settled records only, nothing refused.
        let buckets = claims.from.starts_with("bucket ") && claims.to.starts_with("bucket ");
        return Ok(records
            .into_iter()
            .filter(|(_, r)| settled(r) && !(buckets && claims.from != claims.to))
            .map(|(key, record)| Copy {
                key,
                record,
                accepted: false,
            })
            .collect());
    }
    if claims.window_to_fenced {
        let listed = |pick: &dyn Fn(&str, &ClaimRecord) -> bool| -> (usize, Vec<String>) {
            let keys: Vec<&String> = (records.iter())
                .filter(|(k, r)| pick(k, r))
                .map(|(k, _)| k)
                .collect();
            (
                keys.len(),
                keys.iter().take(10).map(|k| k.to_string()).collect(),
            )
        };
        let (count, keys) = listed(&|_, r| !settled(r));
        if count > 0 {
            return Err(Refused::Unsettled { count, keys });
        }
        let (count, keys) = listed(&|k, r| dead_with_effects(r) && !accepts(k));
        if count > 0 {
            return Err(Refused::DeadWithEffects { count, keys });
        }
    }
    Ok(records
        .into_iter()
        .map(|(key, mut record)| {
            let accepted = dead_with_effects(&record) && accepts(&key);
            if accepted {
                record.accept_dead(by);
            }
            Copy {
                key,
                record,
                accepted,
            }
        })
        .collect())
}

/// A claim record that could not be copied.
#[derive(Debug, thiserror::Error)]
#[error("copying claim record `{key}`: {source}")]
pub struct CopyFailed {
    /// Where it was to be written.
    pub key: String,
    /// What the new store answered.
    pub source: ClaimError,
}

/// Writes `record`, read from the store the route was served from, to `key` of claim store
/// `to`. Hosts serve a route only under its recorded contract, so that store holds every write
/// since the route last moved; a record `to` kept (claims moved A to B to A, or an earlier life
/// of a renamed route's name) dates from before and is written over, at the revision read from
/// the leader. Which of the two is newer is never decided by `updated_ms`: hosts' clocks differ.
/// Whether it wrote.
pub async fn copy_record<S: ClaimStore>(
    to: &S,
    key: &str,
    record: &ClaimRecord,
) -> Result<bool, CopyFailed> {
    let failed = |source| CopyFailed {
        key: key.to_string(),
        source,
    };
    match to.create(key, record).await {
        Ok(_) => return Ok(true),
        Err(ClaimError::Conflict) => {}
        Err(e) => return Err(failed(e)),
    }
    let Some((there, revision)) = to.get_from_leader(key).await.map_err(failed)? else {
        // The key's last write there was a deletion.
        return to
            .create_over_deleted(key, record)
            .await
            .map(|_| true)
            .map_err(failed);
    };
    if there == *record {
        return Ok(false);
    }
    to.update(key, record, revision).await.map_err(failed)?;
    Ok(true)
}

/// How often [`fence`] tries a key: other writes that move it meanwhile are a host's writes
/// still on their way (the hosts drained the route), a few at most.
const FENCE_TRIES: usize = 5;

/// A claim record that could not be fenced in the store the route was served from.
#[derive(Debug, thiserror::Error)]
#[error("fencing claim record `{key}` in the old claim store before copying it (run the change again): {source}")]
pub struct FenceFailed {
    /// Where it lives in the old store.
    pub key: String,
    /// What the old store answered last.
    pub source: ClaimError,
}

/// Fences `key` in claim store `from`, the store the route was served from, before it is
/// copied: reads it from the leader and writes it again at the revision read
/// (compare-and-swap), with no fencing token. A write still on its way from a host that held
/// the key there (its answer lost as it drained: a claim, a fenced commit, a failed-for-good
/// outcome) expects the revision this write moved, and is refused: it cannot land after the
/// copy, to be run again under the new contract. Nor can its lease take the fence for a write
/// of its own that landed late and write again over it: a lease adopts only a record bearing
/// its own fencing token (`Lease::write`'s read-back), which the fence clears. A key that such a write moved meanwhile (or whose fence's answer
/// was lost) is read and fenced again. The record as fenced, to copy; `None` if the key is
/// gone. (A key created after the route's keys were listed is no one's: its host gave the
/// claim up before it drained, and nothing ran under it.)
pub async fn fence<S: ClaimStore>(from: &S, key: &str) -> Result<Option<ClaimRecord>, FenceFailed> {
    let failed = |source| FenceFailed {
        key: key.to_string(),
        source,
    };
    let mut last = ClaimError::Conflict;
    for _ in 0..FENCE_TRIES {
        let Some((record, revision)) = from.get_from_leader(key).await.map_err(failed)? else {
            return Ok(None);
        };
        let fenced = ClaimRecord {
            fencing_token: None,
            ..record.clone()
        };
        match from.update(key, &fenced, revision).await {
            Ok(_) => return Ok(Some(record)),
            Err(e @ (ClaimError::Conflict | ClaimError::Unavailable(_))) => last = e,
            Err(e) => return Err(failed(e)),
        }
    }
    Err(failed(last))
}

/// The stores a move of claim records runs on (the seam): the host's are its claim stores
/// over async-nats, with its change run's lease and the keys' journals of outbound calls; the
/// simulation's are its model server's key spaces.
pub trait Stores {
    /// The old contract's claim store (the one the route was served from).
    type Old: ClaimStore;
    /// The new contract's claim store.
    type To: ClaimStore;
    /// Why a step failed; a refusal ([`Refused`]), a failed fence and a failed copy become one.
    type Error: From<Refused> + From<FenceFailed> + From<CopyFailed>;

    /// Every claim record of the route in the old contract's claim store, each read from its
    /// stream's leader: (claim key, record).
    fn records(&mut self) -> impl Future<Output = Result<Vec<(String, ClaimRecord)>, Self::Error>>;

    /// Called once the copies are planned, before anything is written (the host plans the
    /// keys' journals of outbound calls here, and refuses one the new store cannot take).
    fn planned(&mut self, copies: &[Copy]) -> impl Future<Output = Result<(), Self::Error>>;

    /// Called before copy `index` is written: the run keeps its lease (and stops when it lost
    /// it), and the host writes the key's journal of calls first (a record copied without it
    /// would let the key send its calls again, were the move to stop in between).
    fn before(&mut self, index: usize) -> impl Future<Output = Result<(), Self::Error>>;

    /// The old store, and where claim key `claim_key` lives in it.
    fn old(&self, claim_key: &str) -> (&Self::Old, String);

    /// The new store, and where claim key `claim_key` lives in it.
    fn to(&self, claim_key: &str) -> (&Self::To, String);

    /// Removes claim key `claim_key`'s record from the new store, where it was read at
    /// `revision` (a deletion expecting that revision where the store has one): the old store
    /// no longer holds the key ([`forget`]).
    fn remove(
        &mut self,
        claim_key: &str,
        revision: u64,
    ) -> impl Future<Output = Result<(), Self::Error>>;

    /// Counts a unit of work written.
    fn moved(&mut self);
}

/// What a move wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Moved {
    /// Records written (a record the new store already held as it is is not counted), and
    /// records removed from the new store for keys the old one no longer holds ([`forget`]).
    pub claims: usize,
    /// The keys accepted as settled though dead-lettered after their outputs.
    pub accepted: Vec<String>,
}

/// Moves every claim record of the route from the old contract's claim store to the new one
/// ([`plan`], then each, in the order read, [`fence`]d in the old store and [`copy_record`]ed
/// as fenced): checks every record as listed before writing anything, so a refusal of those
/// writes nothing. A key that a late write moved between the listing and its fence is checked
/// again as fenced, and a refusal then stops the move part-way, with the keys before it
/// copied; like any move that stopped part-way, the next run finishes it, copying every
/// record again. A key gone from the old store by its fence is removed from the new one
/// ([`forget`]).
pub async fn move_claims<S: Stores>(
    stores: &mut S,
    claims: Claims<'_>,
    accepts: &dyn Fn(&str) -> bool,
    by: &str,
) -> Result<Moved, S::Error> {
    let records = stores.records().await?;
    let copies = plan(records, claims, accepts, by)?;
    stores.planned(&copies).await?;
    let mut moved = Moved::default();
    for (index, planned) in copies.into_iter().enumerate() {
        stores.before(index).await?;
        let claim_key = planned.key.clone();
        let Some(copy) = fenced(stores, planned, claims, accepts, by).await? else {
            // Gone from the old store since it was listed: gone from the new one too.
            if forget(stores, &claim_key).await? {
                moved.claims += 1;
                stores.moved();
            }
            continue;
        };
        if copy.accepted {
            moved.accepted.push(copy.key.clone());
        }
        let (to, key) = stores.to(&copy.key);
        let wrote = match revert::reverted(Fix::ChangeMovesClaims) {
            // Before: created only; a record the new store kept stayed as it was.
            true => match to.create(&key, &copy.record).await {
                Ok(_) => true,
                Err(ClaimError::Conflict) => false,
                Err(source) => return Err(CopyFailed { key, source }.into()),
            },
            false => copy_record(to, &key, &copy.record).await?,
        };
        if wrote {
            moved.claims += 1;
        }
        stores.moved();
    }
    Ok(moved)
}

/// Removes claim key `claim_key` from the new store once its fence found it gone from the old
/// one (deleted, or aged out, since the keys were listed): a record the new store kept from an
/// earlier life of the route there (claims moved A to B and back to A) would otherwise stand
/// for the key, stale, where the old store holds none (the review's finding 6). Whether it
/// removed one.
async fn forget<S: Stores>(stores: &mut S, claim_key: &str) -> Result<bool, S::Error> {
    let (to, key) = stores.to(claim_key);
    let read = to.get_from_leader(&key).await;
    let there = read.map_err(|source| CopyFailed { key, source })?;
    let Some((_, revision)) = there else {
        return Ok(false);
    };
    stores.remove(claim_key, revision).await?;
    Ok(true)
}

/// Copy `planned` as its key is once fenced in the old store ([`fence`]): planned again
/// ([`plan`]) from the record as fenced, which a late write of a draining host may have
/// changed since it was listed. `None` if the key is gone. With
/// [`Fix::ChangeFencesClaims`] reverted (test-only), the record as listed, not fenced.
async fn fenced<S: Stores>(
    stores: &S,
    planned: Copy,
    claims: Claims<'_>,
    accepts: &dyn Fn(&str) -> bool,
    by: &str,
) -> Result<Option<Copy>, S::Error> {
    if revert::reverted(Fix::ChangeFencesClaims) || revert::reverted(Fix::ChangeMovesClaims) {
        return Ok(Some(planned));
    }
    let (old, key) = stores.old(&planned.key);
    let Some(record) = fence(old, &key).await? else {
        return Ok(None);
    };
    let mut copies = plan(vec![(planned.key, record)], claims, accepts, by)?;
    Ok(copies.pop())
}

#[cfg(test)]
#[path = "change_tests.rs"]
mod tests;
