//! A simulated host's delivery as the host's own claim-before loop sees it
//! ([`dedup_delivery::before`]): a claim not won ([`SimUnclaimed`]: the model's acks and
//! naks) and a claimed delivery whose handler runs under the lease ([`SimRun`]: the seeded
//! handler, progress acks and renewals in virtual time, the model's settle world
//! [`SimSettle`]). Which answer settles how, the heartbeat beside the run and which outcome
//! settles how are the host's, not restated here; what is here are the model's I/O and the
//! checks the simulation makes as the host's code runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use dedup_delivery::before::{ClaimedDelivery, Handled, Unclaimed};
use dedup_delivery::claim::{ClaimError, Lease};
use dedup_delivery::heartbeat::Progress;
use dedup_delivery::outcome::MessageOutcome;
use dedup_delivery::pinned::Gone;
use dedup_delivery::settle::{Retries, Settlement};
use dedup_delivery::{backoff, coalesce};
use dedup_host::pipeline::busy_delay;

use super::consumer::Lane;
use super::ctx::{At, Ctx, NakMs, Running};
use super::outputs::Outputs;
use super::route::Served;
use super::settling::SimSettle;
use super::store::SimStore;

/// A delivery whose claim a simulated host did not win.
pub(super) struct SimUnclaimed<'a> {
    pub(super) ctx: &'a Ctx,
    pub(super) at: &'a At,
}

impl Unclaimed for SimUnclaimed<'_> {
    /// An ack is checked (the key it was acked for must be done: a busy key's ack could lose
    /// the message); a term answers a failed-for-good key, which a replay may reset meanwhile.
    async fn settle(&self, how: Settlement) {
        match how {
            Settlement::Ack => self.ctx.recorded_settle(self.at, None),
            _ => self.ctx.settle_unchecked(self.at, how.nak_ms()),
        }
    }

    fn count(&self, outcome: MessageOutcome) {
        self.ctx.count(outcome);
    }

    fn busy_delay(&self, retry_in: Duration) -> Duration {
        let s = self.ctx.settings;
        let lease = Duration::from_millis(s.lease_ms + s.skew_ms);
        busy_delay(retry_in, lease, Duration::from_millis(s.backoff_ms))
    }

    /// Counted as an error, as on the host; also notes that the claim may land later,
    /// unseen: a lease nobody renews, which costs an attempt.
    fn claim_failed(&self, _error: &ClaimError) -> Duration {
        self.ctx.unconfirmed(&self.at.key);
        self.ctx.count(MessageOutcome::Error);
        self.ctx.outage_delay(self.at.number)
    }

    /// The model's hosts write every record they read: a record the protocol cannot read is
    /// a defect of the model or the protocol.
    async fn dead_letter(&self, reason: &str) {
        self.ctx.violation(format!(
            "h{} cannot read the record of {}: {reason}",
            self.ctx.host, self.at.key
        ));
    }
}

/// A delivery a simulated host holds the claim for.
pub(super) struct SimRun<'a> {
    pub(super) ctx: &'a Ctx,
    pub(super) at: &'a At,
    pub(super) lease: &'a Lease<SimStore>,
    /// The claims' store (the bucket, or the fenced stream's claim subjects).
    pub(super) store: &'a SimStore,
    pub(super) served: &'a Served,
    /// This host generation's owner id.
    pub(super) owner: &'a str,
    /// The key is coalesced: its ack is not checked, since any later delivery of the key
    /// (this message's own redelivery included) may reclaim a coalesced key at once.
    coalescing: AtomicBool,
    /// The lease lapsed by the host's clock: the heartbeat stopped the work, no store said
    /// the claim was taken over.
    pub(super) lapsed: AtomicBool,
    /// An exclusive route's handler run, listed while it runs and settles.
    running: Mutex<Option<Running>>,
    /// The handler version it runs: the one the host's split chose, or the one that began
    /// the key's effects ([`super::pinned`]).
    pub(super) version: String,
    /// The version its claim names, when it is not installed on this host: not run.
    pub(super) gone: Option<Gone>,
}

impl<'a> SimRun<'a> {
    /// The claimed delivery `at` of the route as `served`, under `lease` in `store`.
    pub(super) fn new(
        ctx: &'a Ctx,
        at: &'a At,
        lease: &'a Lease<SimStore>,
        store: &'a SimStore,
        served: &'a Served,
        owner: &'a str,
        version: String,
    ) -> Self {
        Self {
            ctx,
            at,
            lease,
            store,
            served,
            owner,
            coalescing: AtomicBool::new(false),
            lapsed: AtomicBool::new(false),
            running: Mutex::new(None),
            version,
            gone: None,
        }
    }

    fn settle_with(&self, output: Option<Outputs>) -> SimSettle<'a> {
        SimSettle {
            ctx: self.ctx,
            at: self.at,
            lease: self.lease,
            store: self.store,
            output,
            fenced: self.served.fenced,
            checked: !self.coalescing.load(Ordering::Relaxed),
        }
    }
}

impl Progress for SimRun<'_> {
    async fn progress(&self) -> Result<(), String> {
        let at = self.at;
        self.ctx.world().progress(self.ctx.host, at.delivery());
        Ok(())
    }

    fn unanswered(&self) {
        self.ctx.unconfirmed(&self.at.key);
    }

    fn lapsed(&self) {
        self.ctx.unconfirmed(&self.at.key);
        self.lapsed.store(true, Ordering::Relaxed);
    }
}

impl<'a> ClaimedDelivery for SimRun<'a> {
    type Store = SimStore;
    type Outputs = Outputs;
    type Settle = SimSettle<'a>;
    type Clock = Ctx;

    fn lease(&self) -> &Lease<SimStore> {
        self.lease
    }

    fn fenced(&self) -> bool {
        self.served.fenced
    }

    fn count_outputs(output: &Outputs) -> u32 {
        output.list.len() as u32
    }

    fn settling(&self) -> SimSettle<'a> {
        self.settle_with(None)
    }

    fn succeeded(&self, output: Outputs) -> SimSettle<'a> {
        self.settle_with(Some(output))
    }

    /// Whether a newer message of the entity waits that will run: its key read as the host
    /// reads it (from the leader), judged by the host's [`coalesce::will_run`]. A dead-letter
    /// replay is not judged (the host cannot key it before its letter proves it), nor a key
    /// whose read fails: this one runs.
    async fn superseded(&self) -> bool {
        if !self.ctx.settings.mode.coalesce || self.at.lane != Lane::Queue {
            return false;
        }
        let newest = {
            let w = self.ctx.world();
            let newest = w.streams.newest_after(self.at.sequence);
            let ours = w.streams.message(Lane::Queue, self.at.sequence).source;
            newest.map(|m| (m.key.clone(), (ours, m.source), m.fresh_from > 0))
        };
        let newer = match newest {
            None | Some((_, _, true)) => false,
            Some((key, sequences, false)) => match self.store.get_fresh(&key).await {
                Ok(read) => coalesce::will_run(read.as_ref().map(|(r, _)| r), sequences),
                Err(_) => false,
            },
        };
        self.coalescing.store(newer, Ordering::Relaxed);
        newer
    }

    fn pinned_gone(&self) -> Option<&Gone> {
        self.gone.as_ref()
    }

    /// Read from the model's components, as the host reads its bucket ([`Ctx::offered`]).
    async fn offered(&self, digest: &str) -> Result<bool, String> {
        self.ctx.offered(digest).await
    }

    /// Jittered by the seeded random source.
    fn jittered(&self, ceiling: Duration) -> Duration {
        backoff::jittered(ceiling, self.ctx.unit())
    }

    /// The seeded handler ([`Ctx::invoke`]), registered first on an exclusive route, where
    /// overlapping runs of an entity are checked.
    async fn invoke(&self, attempt: u32) -> Result<Handled<Outputs>, String> {
        let ctx = self.ctx;
        if ctx.settings.mode.exclusive {
            let running = ctx.exclusive_start(self.at, self.served, self.owner);
            *self.running.lock().expect("one thread") = Some(running);
        }
        ctx.invoke(&self.at.key, attempt, &self.version).await
    }

    fn retries(&self) -> Retries {
        let s = self.ctx.settings;
        let backoff = Duration::from_millis(s.backoff_ms);
        Retries {
            max: s.max_deliver,
            backoff,
            max_backoff: backoff,
        }
    }

    /// Never asked: the model's handlers always find an instance.
    fn pool_full_delay(&self) -> Duration {
        self.ctx.outage_delay(self.at.number)
    }

    fn heartbeat(&self) -> Duration {
        Duration::from_millis(self.ctx.settings.heartbeat_ms)
    }

    fn clock(&self) -> &Ctx {
        self.ctx
    }
}
