//! A change run's hold on its route's change mark ([`Changing`]): written by revision before
//! the run moves anything, renewed while it moves claims and queued messages, and ended by the
//! record the run writes last. Two runs on one route never move at once: a run that finds a
//! live mark of another run is refused naming it ([`ChangeError::Running`]), and a run whose
//! mark was taken over (its lease lapsed while it was paused or cut off) finds out at its next
//! renewal, made by revision before each unit of work once a third of the lease has passed,
//! and stops ([`LeaseLost`]). A mark whose lease lapsed is taken over by the next run without
//! a flag: its run is dead, or stopped and released it, or (paused) stops at its next
//! renewal, and the run taking over finishes the change or calls it off as any rerun does.
//!
//! Test switches (test-only, read from the environment; never set them in production):
//! `DEDUP_HOST_TEST_CHANGE_LEASE_MS` shortens the lease, and `DEDUP_HOST_TEST_HOLD_CHANGE`
//! names a file: while it exists, a run that has moved one unit waits there, renewing its
//! lease (a run held mid-move).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use async_nats::jetstream::kv::Store;

use super::ChangeError;
use crate::claim::record::now_ms;
use crate::config::Config;
use crate::contract::{self, ChangeRun, Changing, ContractRecord, RouteContract};

/// How long a change run's mark holds without renewal.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// Test-only: the lease in milliseconds.
const LEASE_ENV: &str = "DEDUP_HOST_TEST_CHANGE_LEASE_MS";

/// Test-only: a file that holds a run after its first unit of work while it exists.
const HOLD_ENV: &str = "DEDUP_HOST_TEST_HOLD_CHANGE";

/// A change run lost its mark: another run took the change over.
#[derive(Debug, thiserror::Error)]
#[error("route `{route}`: this change run stopped: it could not renew its mark on the contract record (key `{route}` of `{bucket}`): {reason}. Another run took the change over once this run's lease lapsed (this process was paused or cut off from the server for longer than the lease), so this run moved nothing more; that run finishes the change or calls it off. Run the command again only if no run holds the mark (a refusal names the one that does)")]
pub struct LeaseLost {
    /// The route.
    pub route: String,
    /// The contracts bucket.
    pub bucket: String,
    /// What the record holds now, or why the renewal failed.
    pub reason: String,
}

/// Refuses when `marked`, the mark a route's record carries, is held by a live run: another
/// change or rename of the route is moving its claims or queue.
pub(crate) fn refuse_running(
    config: &Config,
    store: &Store,
    route: &str,
    marked: Option<&Changing>,
) -> Result<(), ChangeError> {
    let now = now_ms();
    match marked.and_then(|m| m.live_run(now, config.claims.clock_skew)) {
        Some(run) => Err(ChangeError::Running {
            route: route.to_string(),
            bucket: store.name.clone(),
            run: run.describe(now),
        }),
        None => Ok(()),
    }
}

/// This run's hold on a route's change mark.
pub(crate) struct Lease {
    store: Store,
    route: String,
    /// The record the mark travels beside.
    recorded: ContractRecord,
    mark: Changing,
    revision: u64,
    length: Duration,
    renewed: Instant,
    /// Units of work done (claim records copied, queued messages moved).
    moved: u64,
    hold: Option<PathBuf>,
}

impl Lease {
    /// Marks `route`'s record `recorded` (at `revision`) as changing to `to` since `since_ms`,
    /// held by this process. Refused naming the run when another run marked it first.
    pub(crate) async fn take(
        config: &Config,
        store: &Store,
        route: &str,
        recorded: &ContractRecord,
        (to, since_ms): (RouteContract, u64),
        revision: u64,
    ) -> anyhow::Result<Self> {
        let length = std::env::var(LEASE_ENV)
            .ok()
            .and_then(|ms| ms.parse().ok())
            .map_or(DEFAULT_LEASE, Duration::from_millis);
        let mark = Changing {
            to,
            since_ms,
            run: Some(ChangeRun::this_process(length)),
        };
        let bytes = contract::encode(recorded, Some(&mark));
        let revision = match store.update(route, bytes, revision).await {
            Ok(revision) => revision,
            Err(e) => {
                // Another run may have marked it a moment ago: name it.
                let (_, marked) = contract::lookup_marked(store, route).await?;
                refuse_running(config, store, route, marked.as_ref())?;
                anyhow::bail!(
                    "route `{route}`'s contract changed meanwhile ({e}): run the command again"
                );
            }
        };
        Ok(Lease {
            store: store.clone(),
            route: route.to_string(),
            recorded: recorded.clone(),
            mark,
            revision,
            length,
            renewed: Instant::now(),
            moved: 0,
            hold: std::env::var_os(HOLD_ENV).map(PathBuf::from),
        })
    }

    /// Called before each unit of work (one claim record read or copied, one queued message
    /// moved): renews the lease by revision once a third of it has passed, and stops the run
    /// when another run took the mark over.
    pub(crate) async fn keep(&mut self) -> Result<(), LeaseLost> {
        if let Some(hold) = self.hold.clone().filter(|_| self.moved > 0) {
            while hold.exists() {
                self.renew().await?;
                tokio::time::sleep(self.length / 4).await;
            }
        }
        if self.renewed.elapsed() >= self.length / 3 {
            self.renew().await?;
        }
        Ok(())
    }

    /// Counts a unit of work written (a claim record copied, a queued message moved).
    pub(crate) fn moved(&mut self) {
        self.moved += 1;
    }

    /// Writes the mark with a lease from now, over the revision this run last wrote.
    async fn renew(&mut self) -> Result<(), LeaseLost> {
        let until = now_ms() + self.length.as_millis() as u64;
        self.write(until).await?;
        self.renewed = Instant::now();
        Ok(())
    }

    /// Writes the mark with its lease until `until_ms`, by revision. An answer lost on the
    /// way may have landed: a record holding exactly what was written is this run's.
    async fn write(&mut self, until_ms: u64) -> Result<(), LeaseLost> {
        if let Some(run) = self.mark.run.as_mut() {
            run.lease_until_ms = until_ms;
        }
        let bytes = contract::encode(&self.recorded, Some(&self.mark));
        let error = match self
            .store
            .update(&self.route, bytes.clone(), self.revision)
            .await
        {
            Ok(revision) => {
                self.revision = revision;
                return Ok(());
            }
            Err(e) => e.to_string(),
        };
        let (route, bucket) = (self.route.clone(), self.store.name.clone());
        let lost = |reason: String| LeaseLost {
            route,
            bucket,
            reason,
        };
        match self.store.entry(&self.route).await {
            Ok(Some(entry)) if entry.value == bytes => {
                self.revision = entry.revision;
                Ok(())
            }
            Ok(_) => {
                let now = now_ms();
                let holder = match contract::lookup_marked(&self.store, &self.route).await {
                    Ok((_, Some(Changing { run: Some(run), .. }))) => {
                        format!("the mark is now held by {}", run.describe(now))
                    }
                    Ok((_, _)) => "the record no longer carries this run's mark".to_string(),
                    Err(e) => e.to_string(),
                };
                Err(lost(format!("{holder} ({error})")))
            }
            Err(e) => Err(lost(format!("{error}; reading the record: {e}"))),
        }
    }

    /// Leaves the mark with its lease released, so the next run may take it over at once;
    /// a failure leaves it to lapse by itself.
    pub(crate) async fn release(mut self) {
        let _ = self.write(0).await;
    }

    /// Clears the mark (the run was refused before it moved anything).
    pub(crate) async fn clear(self) -> anyhow::Result<()> {
        let recorded = self.recorded.clone();
        self.end(&recorded).await
    }

    /// Writes `record` without a mark, over the revision this run last wrote: the end of the
    /// change, or of its call-off.
    pub(crate) async fn end(self, record: &ContractRecord) -> anyhow::Result<()> {
        let route = &self.route;
        self.store
            .update(route, contract::encode(record, None), self.revision)
            .await
            .map(|_| ())
            .map_err(|e| {
                anyhow::anyhow!(LeaseLost {
                    route: route.clone(),
                    bucket: self.store.name.clone(),
                    reason: format!("the last write of the change failed: {e}"),
                })
            })
    }

    /// What an operator is told when a run stopped with the mark left: where it is and how to
    /// finish the change or clear it.
    pub(crate) fn left(&self) -> String {
        let route = &self.route;
        format!(
            "its mark stays on route `{route}`'s contract record (key `{route}` of `{}`), with its lease released, and hosts do not start the route while it is there; finish the change by running `dedup-host setup --config <the new config> --change-route {route}` again, or clear the mark by running that command with a config that matches the recorded contract (it calls the change off and puts back what moved)",
            self.store.name
        )
    }
}
