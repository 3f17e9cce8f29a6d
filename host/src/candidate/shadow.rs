//! Shadow runs: the candidate runs on the event the live version just handled, and its outcome
//! is compared and thrown away. Shadow runs never hold up live work: one starts only while the
//! route has a spare guest slot and one of the candidate's shadow slots is free (else it is
//! counted as skipped), and they run on their own thread at the lowest CPU priority, so the
//! live version's guests and the host's I/O always come first. Their limits are the route's;
//! a candidate's trap is a finding, never the live outcome. A shadow never sends an outbound
//! HTTP call: its calls are answered from the live run's journal or refused, and the
//! comparison shows the requests each run made.

use std::collections::BTreeSet;
use std::sync::Arc;

use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::compare::{self, Difference, Summary};
use super::record::{Counts, Finding, Sample};
use super::{Candidate, Mode};
use crate::bindings::Event;
use crate::metrics::RouteMetrics;
use crate::runtime::{Handler, Invocation, InvokeOptions};

/// The shadow thread and where findings go.
#[derive(Clone)]
pub struct Shadows {
    runtime: tokio::runtime::Handle,
    findings: mpsc::Sender<Finding>,
}

impl std::fmt::Debug for Shadows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shadows").finish_non_exhaustive()
    }
}

/// A shadow run decided before the live call: the candidate, its slot and the event.
pub struct Pending {
    candidate: Arc<Candidate>,
    _slot: OwnedSemaphorePermit,
    event: Event,
}

/// A runtime with one worker thread at the lowest CPU priority (nice 19), for shadow runs.
pub fn low_priority_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("shadow")
        .enable_time()
        .on_thread_start(|| {
            // SAFETY: setpriority on this thread's own id has no memory effects; a failure
            // leaves the thread at normal priority, which is only less polite.
            unsafe {
                let tid = libc::gettid();
                libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
            }
        })
        .build()
}

impl Shadows {
    /// Shadow runs on `runtime` (see [`low_priority_runtime`]), findings sent to `findings`.
    pub fn new(runtime: tokio::runtime::Handle, findings: mpsc::Sender<Finding>) -> Self {
        Self { runtime, findings }
    }

    /// Decides, before the live version runs `event`, whether `candidate` shadows it: only a
    /// shadow candidate, with a spare route slot (`free_slots`) and a free shadow slot. A
    /// skipped run is counted.
    pub fn prepare(
        &self,
        candidate: Option<Arc<Candidate>>,
        free_slots: usize,
        event: &Event,
        metrics: &RouteMetrics,
    ) -> Option<Pending> {
        let candidate = candidate?;
        if !matches!(candidate.spec.mode, Mode::Shadow { .. }) || !candidate.active() {
            return None;
        }
        let slot = match free_slots {
            0 => None,
            _ => candidate.shadow_slots.clone().try_acquire_owned().ok(),
        };
        let Some(slot) = slot else {
            metrics.rollout.shadow("skipped");
            let _ = self.findings.try_send(Finding {
                route: event.route.clone(),
                digest: candidate.digest().to_string(),
                counts: Counts {
                    skipped: 1,
                    ..Default::default()
                },
                sample: None,
            });
            return None;
        };
        Some(Pending {
            candidate,
            _slot: slot,
            event: event.clone(),
        })
    }

    /// Runs the pending shadow run in the background and records what it finds against the
    /// live run `live`. `live_handler` runs again for a `secondary` comparison.
    pub fn run(
        &self,
        pending: Pending,
        live: &Invocation,
        live_handler: Option<Handler>,
        options: InvokeOptions,
        metrics: Arc<RouteMetrics>,
    ) {
        let live = Summary::of(live);
        let options = never_sending(options);
        let findings = self.findings.clone();
        self.runtime.spawn(async move {
            let Pending {
                candidate,
                _slot,
                event,
            } = pending;
            let secondary = match candidate.spec.mode {
                Mode::Shadow { secondary } => secondary,
                Mode::Canary { .. } => false,
            };
            let ran = candidate.handler.invoke(event.clone(), &options).await;
            metrics.rollout.run("candidate", "shadow");
            let ran = Summary::of(&ran);
            let noise = match (secondary, live_handler) {
                (true, Some(h)) => {
                    let again = Summary::of(&h.invoke(event.clone(), &options).await);
                    metrics.rollout.run("live", "shadow");
                    compare::diff(&live, &again, &candidate.spec.ignore)
                }
                _ => Vec::new(),
            };
            let found = compare::diff(&live, &ran, &candidate.spec.ignore);
            let finding = judge(&event, &candidate, live, ran, found, &noise, &metrics);
            let _ = findings.try_send(finding);
        });
    }
}

/// The live run's options as a shadow run gets them: its outbound calls are answered from
/// the live run's journal or refused, never sent, and nothing is recorded (issue 45).
fn never_sending(mut options: InvokeOptions) -> InvokeOptions {
    options.journal = options.journal.map(|j| j.replay_only());
    if options.journal.is_none() {
        options.http = None;
    }
    options
}

/// Counts a comparison: a match, noise (every difference also seen between two live runs) or
/// a difference of the candidate's own, with a sample.
fn judge(
    event: &Event,
    candidate: &Candidate,
    live: Summary,
    ran: Summary,
    found: Vec<Difference>,
    noise: &[Difference],
    metrics: &RouteMetrics,
) -> Finding {
    let noisy: BTreeSet<&str> = noise.iter().map(|d| d.path.as_str()).collect();
    let own: Vec<&Difference> = found
        .iter()
        .filter(|d| !noisy.contains(d.path.as_str()))
        .collect();
    let mut counts = Counts {
        compared: 1,
        live_time_us: live.time_us,
        candidate_time_us: ran.time_us,
        live_fuel: live.fuel.unwrap_or(0),
        candidate_fuel: ran.fuel.unwrap_or(0),
        ..Default::default()
    };
    let result = match (found.is_empty(), own.is_empty()) {
        (true, _) => {
            counts.matches = 1;
            "match"
        }
        (false, true) => {
            counts.noise = 1;
            "noise"
        }
        (false, false) => {
            counts.differences = 1;
            "difference"
        }
    };
    metrics.rollout.shadow(result);
    let kinds: BTreeSet<compare::Kind> = own.iter().map(|d| d.kind).collect();
    for kind in &kinds {
        metrics.rollout.difference(kind.label());
        *counts.kinds.entry(*kind).or_default() += 1;
    }
    candidate.shadowed(!own.is_empty(), &metrics.rollout);
    let sample = (!own.is_empty()).then(|| Sample {
        sequence: event.stream_sequence,
        key: event.key.clone(),
        at_ms: crate::claim::record::now_ms(),
        differences: own.iter().take(20).map(|d| d.path.clone()).collect(),
        kinds: kinds.into_iter().collect(),
        live,
        candidate: ran,
    });
    Finding {
        route: event.route.clone(),
        digest: candidate.digest().to_string(),
        counts,
        sample,
    }
}
