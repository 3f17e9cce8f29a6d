//! Component files, polled for new versions.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{watch, Notify};

use super::install;
use crate::routes::Route;
use crate::runtime::Runtime;

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
/// handler; it comes back with the file.
pub async fn watch(
    runtime: Runtime,
    route: Arc<Route>,
    path: PathBuf,
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
            if offered.take().is_some() || route.guest().is_some() {
                install::remove(&route, &origin);
            } else {
                route.decide();
            }
            continue;
        }
        if now == offered {
            continue;
        }
        offered = now;
        match std::fs::read(&path) {
            Ok(bytes) => {
                install::offer(&runtime, &route, &origin, bytes).await;
            }
            Err(e) => tracing::warn!(route = %route.name, "cannot read component `{origin}`: {e}"),
        }
    }
}
