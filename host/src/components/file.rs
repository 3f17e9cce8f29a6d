//! Component files, polled for new versions.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use super::install;
use crate::routes::Route;
use crate::runtime::Runtime;

/// What identifies a file's version cheaply, before reading it.
type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// Offers `path` to `route` at once, then polls it every `interval`; a changed file is offered to `route` once it has stopped
/// changing for one interval (so a half-copied file is not taken). A file missing for two
/// polls in a row removes the route's handler; it comes back with the file.
pub async fn watch(
    runtime: Runtime,
    route: Arc<Route>,
    path: PathBuf,
    interval: Duration,
    mut stopped: watch::Receiver<bool>,
) {
    let origin = path.display().to_string();
    // The stamp of the version last offered, and the one seen at the last poll. The first
    // poll is at once and offers the file as it is (the route starts unserved).
    let mut offered = None;
    let mut last = stamp(&path);
    let mut missing = 0;
    let mut first = true;
    loop {
        if !std::mem::take(&mut first) {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = stopped.changed() => return,
            }
        }
        let now = stamp(&path);
        if now.is_none() {
            missing += 1;
            if missing == 2 {
                install::remove(&route, &origin);
                offered = None;
            }
            last = None;
            continue;
        }
        missing = 0;
        let settled = now == last;
        last = now;
        if !settled || now == offered {
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
