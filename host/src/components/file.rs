//! Component files, polled for new versions.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{mpsc, watch, Notify};

use super::install;
use crate::candidate::{files, Action};
use crate::routes::Route;
use crate::runtime::Runtime;

/// What a watched file is to its route.
#[derive(Debug, Clone)]
pub enum Slot {
    /// The live version (the route's component file).
    Live,
    /// The candidate beside the live file `live` ([`files`]); decisions go to `actions`.
    Candidate {
        /// The live component file.
        live: PathBuf,
        /// Where this host's rollback and promotion decisions go.
        actions: mpsc::UnboundedSender<Action>,
    },
}

/// What identifies a file's version cheaply, before reading it.
type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// Offers `path` to `route` at once, then checks it every `interval` and whenever `poke`
/// wakes it (a file event in a watched component directory). A changed file is offered once
/// its stamp has stayed the same for one interval, so a half-copied file is never taken, however
/// often events wake the watcher. A file missing for one interval removes the route's
/// handler; it comes back with the file. A [`Slot::Candidate`] file is offered as the route's
/// candidate the same way, and its removal drops the candidate.
pub async fn watch(
    runtime: Runtime,
    route: Arc<Route>,
    (path, slot): (PathBuf, Slot),
    interval: Duration,
    poke: Option<Arc<Notify>>,
    mut stopped: watch::Receiver<bool>,
) {
    let origin = path.display().to_string();
    // The stamp of the version last offered, the one seen last and since when. A file there
    // at start is offered at once (the route starts unserved), unless it changed within the
    // last interval: it may still be being written.
    let mut offered = None;
    let mut last = stamp(&path);
    let settled =
        last.is_none_or(|(modified, _)| modified.elapsed().is_ok_and(|age| age >= interval));
    let mut since = if settled {
        Instant::now()
            .checked_sub(interval)
            .unwrap_or_else(Instant::now)
    } else {
        Instant::now()
    };
    let mut first = true;
    let poked = || async {
        match &poke {
            Some(p) => p.notified().await,
            None => std::future::pending().await,
        }
    };
    loop {
        if !std::mem::take(&mut first) {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = poked() => {}
                _ = stopped.changed() => return,
            }
        }
        let now = stamp(&path);
        if now != last {
            last = now;
            since = Instant::now();
            continue;
        }
        if since.elapsed() < interval {
            continue; // not settled yet
        }
        if now.is_none() {
            let had = offered.take().is_some();
            match &slot {
                Slot::Live if had || route.guest().is_some() => install::remove(&route, &origin),
                Slot::Live => route.decide(),
                Slot::Candidate { actions, .. } if had || route.candidate().is_some() => {
                    install::offer_candidate(&runtime, &route, &origin, None, actions).await
                }
                Slot::Candidate { .. } => {}
            }
            continue;
        }
        if now == offered {
            continue;
        }
        offered = now;
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::warn!(route = %route.name, "cannot read component `{origin}`: {e}");
                continue;
            }
        };
        match &slot {
            Slot::Live => {
                install::offer(&runtime, &route, &origin, bytes).await;
            }
            Slot::Candidate { live, actions } => {
                let since = now
                    .and_then(|(modified, _)| modified.duration_since(SystemTime::UNIX_EPOCH).ok());
                let since_ms = since.map_or(0, |d| d.as_millis() as u64);
                match files::spec(live, &bytes, since_ms) {
                    Ok(spec) => {
                        let candidate = Some((bytes, spec));
                        install::offer_candidate(&runtime, &route, &origin, candidate, actions)
                            .await
                    }
                    Err(e) => {
                        tracing::error!(route = %route.name, "refused candidate `{origin}`: {e}");
                        install::offer_candidate(&runtime, &route, &origin, None, actions).await
                    }
                }
            }
        }
    }
}
