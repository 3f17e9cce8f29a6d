//! A route's contract record (DESIGN.md rule 19), read or recorded over the
//! [`ContractStore`] seam: a route never set up gets the writer's contract recorded; a set-up
//! command also records over a deleted or unreadable record; a serving host never does (a
//! host refused for its config must not win a race to record it), and keeps serving under
//! the contract it holds when the record was deleted. The host implements the store over its
//! contract bucket (`host/src/contract.rs`), the simulation over its model server; what a
//! record holds and how it compares with a config is the caller's ([`Settled::verdict`]).

use std::future::Future;

use super::agreement::Comparison;

/// What the store holds for a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found<R> {
    /// Nothing, ever: the route was never set up.
    Never,
    /// A record was written, then deleted or purged: the deletion's revision.
    Deleted(u64),
    /// A record with its revision, and when the contract change it carries began (Unix
    /// milliseconds), if one is under way.
    Recorded {
        /// The record.
        record: R,
        /// Its revision.
        revision: u64,
        /// When the change under way began, if one is.
        changing: Option<u64>,
    },
    /// A record that does not parse: its revision and why.
    Unreadable {
        /// Its revision.
        revision: u64,
        /// Why it does not parse.
        reason: String,
    },
}

/// How a write by revision ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The record was written.
    Written,
    /// The key changed since the revision given: another writer was first.
    Raced,
}

/// The store of a deployment's route contracts: a read with the revision, and a write by
/// revision (0: the key was never written). There is no plain create: a create also writes
/// over a deleted key, and a host must never record a contract someone deleted.
pub trait ContractStore {
    /// A contract record as stored.
    type Record;
    /// Why the store did not answer.
    type Error;

    /// What the store holds for `route`.
    fn get(
        &self,
        route: &str,
    ) -> impl Future<Output = Result<Found<Self::Record>, Self::Error>> + Send;

    /// Writes `record` for `route` if the key is still at `revision`.
    fn update(
        &self,
        route: &str,
        record: &Self::Record,
        revision: u64,
    ) -> impl Future<Output = Result<Written, Self::Error>> + Send;
}

/// Who reads or records a contract, which decides what it may record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// A set-up command: records when the route has none, was deleted or is unreadable, and
    /// is not kept out by a change under way (it is the change, or finishes it).
    Setup,
    /// A serving host: records only for a route never set up.
    Host {
        /// Whether the contract it last agreed on for the route is the one its config asks
        /// for now: it keeps serving under that one when the record was deleted.
        holds_wanted: bool,
    },
}

/// What reading or recording a route's contract came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled<R> {
    /// A record is there: the caller judges it.
    Found {
        /// The record.
        record: R,
        /// When the change under way that keeps this writer out began, if one is (a set-up
        /// command is never kept out).
        changing: Option<u64>,
    },
    /// This writer recorded its contract.
    Recorded,
    /// The record was deleted and the host serves under the contract it holds.
    Held,
    /// The record was deleted and the host holds no contract its config asks for.
    Deleted,
    /// The record does not parse (only a set-up command records it anew): why.
    Unreadable(String),
    /// The record neither stayed nor could be written: other writers kept winning.
    Exhausted,
}

/// How many times a write that lost a race is tried again, reading the key anew each time.
const TRIES: usize = 3;

/// Reads `route`'s record and, where `writer` may, records `new()` over what it found.
pub async fn settle<S: ContractStore>(
    store: &S,
    route: &str,
    writer: Writer,
    new: impl Fn() -> S::Record,
) -> Result<Settled<S::Record>, S::Error> {
    for _ in 0..TRIES {
        // The revision a record may be written over: 0 is "no record of the key at all".
        let over = match (store.get(route).await?, writer) {
            (
                Found::Recorded {
                    record, changing, ..
                },
                writer,
            ) => {
                let changing = changing.filter(|_| writer != Writer::Setup);
                return Ok(Settled::Found { record, changing });
            }
            (Found::Never, _) => 0,
            (Found::Deleted(revision), Writer::Setup) => revision,
            // Test-only: the old read, which took a deleted record for none, so any host
            // recorded its own config over it (issue 42, finding 4).
            (Found::Deleted(revision), Writer::Host { .. })
                if crate::revert::reverted(crate::revert::Fix::DeletedContractStays) =>
            {
                revision
            }
            (Found::Unreadable { revision, .. }, Writer::Setup) => revision,
            (Found::Deleted(_), Writer::Host { holds_wanted: true }) => {
                tracing::warn!(
                    route,
                    "the route's contract was deleted; serving under the contract this host holds until `dedup-host setup --change-route {route}` records one"
                );
                return Ok(Settled::Held);
            }
            (Found::Deleted(_), Writer::Host { .. }) => return Ok(Settled::Deleted),
            (Found::Unreadable { reason, .. }, Writer::Host { .. }) => {
                return Ok(Settled::Unreadable(reason))
            }
        };
        // Written against the revision read (not a create, which also writes over a deleted
        // key): a contract deleted meanwhile is never recorded anew by a host.
        match store.update(route, &new(), over).await? {
            Written::Written => {
                tracing::info!(route, "route contract recorded");
                return Ok(Settled::Recorded);
            }
            // Another writer was first (or our own lost answer landed): look again.
            Written::Raced => continue,
        }
    }
    Ok(Settled::Exhausted)
}

/// What a route's contract came to, once a found record was judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict<E> {
    /// The config agrees with the contract (found, recorded, or held).
    Agrees,
    /// The judge refused the found record: why.
    Refused(E),
    /// The found record agrees, but a contract change under way (since, in Unix
    /// milliseconds) keeps the writer out.
    Changing(u64),
    /// The record was deleted and the host holds no contract its config asks for.
    Deleted,
    /// The record does not parse: why.
    Unreadable(String),
    /// The record neither stayed nor could be written.
    Exhausted,
}

impl<R> Settled<R> {
    /// The verdict, judging a found record with `judge` (its owner, consumer and contract
    /// against the config): a change under way counts only for a record that agrees, so a
    /// config refused for itself learns why, not that a change runs.
    pub fn verdict<E>(self, judge: impl FnOnce(&R) -> Result<(), E>) -> Verdict<E> {
        match self {
            Settled::Found { record, changing } => match (judge(&record), changing) {
                (Err(e), _) => Verdict::Refused(e),
                (Ok(()), Some(since)) => Verdict::Changing(since),
                (Ok(()), None) => Verdict::Agrees,
            },
            Settled::Recorded | Settled::Held => Verdict::Agrees,
            Settled::Deleted => Verdict::Deleted,
            Settled::Unreadable(reason) => Verdict::Unreadable(reason),
            Settled::Exhausted => Verdict::Exhausted,
        }
    }
}

impl Verdict<Comparison> {
    /// The comparison a host decides on ([`super::agreement::decide`]), when the verdict is
    /// one: `None` when the store could not settle the record (try again later).
    pub fn comparison(self) -> Option<Comparison> {
        match self {
            Verdict::Agrees => Some(Comparison::Agrees),
            Verdict::Refused(comparison) => Some(comparison),
            Verdict::Changing(_) => Some(Comparison::Changing),
            Verdict::Deleted => Some(Comparison::Deleted),
            Verdict::Unreadable(_) | Verdict::Exhausted => None,
        }
    }
}

#[cfg(test)]
#[path = "contract_tests.rs"]
mod tests;
