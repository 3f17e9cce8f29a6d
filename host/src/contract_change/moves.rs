//! The host's side of a contract change's move of claim records
//! ([`dedup_delivery::change::move_claims`]): the seam's [`Stores`] over async-nats, with the
//! run's lease kept before each unit of work and each claim's journal of outbound calls
//! ([`super::calls`]) planned before anything is written and written before its record (each
//! record is fenced in the old store, then copied: `dedup_delivery::change::fence`).

use anyhow::Context as _;
use async_nats::jetstream::Context;
use dedup_delivery::change::{Copy, Stores};

use super::calls::{self, CallsMove};
use super::claims::{read_records, store_key};
use super::{AcceptedDead, ChangeError, Lease};
use crate::claim::host::HostClaimStore;
use crate::claim::record::ClaimRecord;
use crate::config::RouteConfig;

/// The claim stores of one move: the old contract's (`from`) and the new one's (`to`).
pub(super) struct HostStores<'a> {
    pub(super) js: &'a Context,
    pub(super) route: &'a RouteConfig,
    pub(super) from: HostClaimStore,
    pub(super) to: HostClaimStore,
    /// The old and new contracts' claims (`bucket <name>` or `stream <name>`).
    pub(super) claims: (&'a str, &'a str),
    pub(super) accepted: &'a AcceptedDead,
    pub(super) lease: &'a mut Lease,
    /// Each copy's journal, in the copies' order, once planned.
    pub(super) journals: Vec<CallsMove>,
    /// Call records written.
    pub(super) calls_moved: usize,
}

impl Stores for HostStores<'_> {
    type Old = HostClaimStore;
    type To = HostClaimStore;
    type Error = anyhow::Error;

    async fn records(&mut self) -> anyhow::Result<Vec<(String, ClaimRecord)>> {
        let name = &self.route.name;
        let records = read_records(self.js, &self.from, self.claims.0, name, self.lease).await?;
        self.accepted.check(name, &records)?;
        Ok(records)
    }

    async fn planned(&mut self, copies: &[Copy]) -> anyhow::Result<()> {
        self.journals = plan_journals(self, copies).await?;
        Ok(())
    }

    async fn before(&mut self, index: usize) -> anyhow::Result<()> {
        self.lease.keep().await?;
        // The journal first: a record copied without it would let the key send its calls
        // again, were the move to stop in between.
        let journal = &self.journals[index];
        journal.apply(self.js).await?;
        self.calls_moved += journal.len();
        Ok(())
    }

    fn old(&self, claim_key: &str) -> (&HostClaimStore, String) {
        (&self.from, store_key(self.claims.0, claim_key))
    }

    fn to(&self, claim_key: &str) -> (&HostClaimStore, String) {
        (&self.to, store_key(self.claims.1, claim_key))
    }

    async fn remove(&mut self, claim_key: &str, revision: u64) -> anyhow::Result<()> {
        let to = self.claims.1;
        let key = store_key(to, claim_key);
        let removing = || {
            format!(
                "removing claim record `{key}` ({to}), which the old claim store no longer holds"
            )
        };
        match to.strip_prefix("stream ") {
            // A fenced stream's claim subject holds the key's records only: purged up to the
            // record read (its sequence is its revision), as the bucket's delete expects it,
            // so a record written there since stays (nothing should write there while the
            // route is marked).
            Some(stream) => {
                let s = self.js.get_stream(stream).await.with_context(removing)?;
                let purge = s.purge().filter(key.clone()).sequence(revision + 1);
                purge.await.with_context(removing)?;
            }
            None => {
                let bucket = to.strip_prefix("bucket ").unwrap_or(to);
                let kv = self.js.get_key_value(bucket).await.with_context(removing)?;
                (kv.delete_expect_revision(&key, Some(revision)).await).with_context(removing)?;
            }
        }
        Ok(())
    }

    fn moved(&mut self) {
        self.lease.moved();
    }
}

/// How to copy the journal of outbound calls of each of `copies` from the old claim store to
/// the new one, in their order; refused ([`ChangeError::CallsTooLarge`]) when a record is
/// larger than the new store takes.
async fn plan_journals(s: &mut HostStores<'_>, copies: &[Copy]) -> anyhow::Result<Vec<CallsMove>> {
    let (from, to) = s.claims;
    let stream = calls::stream_of(to);
    let max = calls::max_bytes(s.js, &stream).await?;
    let mut journals = Vec::new();
    let mut too_large = Vec::new();
    for copy in copies {
        s.lease.keep().await?;
        let claim_key = copy.key.as_str();
        match calls::plan(s.js, (from, claim_key), (to, claim_key), max).await? {
            Ok(journal) => journals.push(journal),
            Err(large) => too_large.push(large),
        }
    }
    if too_large.is_empty() {
        return Ok(journals);
    }
    Err(ChangeError::CallsTooLarge {
        route: s.route.name.clone(),
        count: too_large.len(),
        keys: too_large.iter().take(10).map(|t| t.key.clone()).collect(),
        largest: too_large.iter().map(|t| t.bytes).max().unwrap_or_default(),
        stream,
        max: max.unwrap_or_default(),
    }
    .into())
}
