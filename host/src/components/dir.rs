//! A directory of components (`components.dir`): `<route>.wasm` serves the route of that
//! name. The directory is watched with the operating system's file events (inotify on
//! Linux, through the `notify` crate), falling back to polling where those are unavailable;
//! each event wakes the routes' file watchers ([`super::file`]), which still take a file only
//! once it has stopped changing, and keep polling in case an event is missed.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::Notify;

/// Watches `dir`, waking `poke`'s waiters on every change, for as long as the returned
/// watcher lives.
pub fn watch(
    dir: &Path,
    poke: Arc<Notify>,
    poll: Duration,
) -> anyhow::Result<Box<dyn Watcher + Send>> {
    let wake = {
        let poke = poke.clone();
        move |event: notify::Result<notify::Event>| {
            if event.is_ok() {
                poke.notify_waiters();
            }
        }
    };
    let mut watcher: Box<dyn Watcher + Send> = match notify::recommended_watcher(wake) {
        Ok(w) => Box::new(w),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), "no file events here ({e}); polling the component directory");
            let config = notify::Config::default().with_poll_interval(poll);
            Box::new(notify::PollWatcher::new(
                move |event: notify::Result<notify::Event>| {
                    if event.is_ok() {
                        poke.notify_waiters();
                    }
                },
                config,
            )?)
        }
    };
    watcher
        .watch(dir, RecursiveMode::NonRecursive)
        .map_err(|e| anyhow::anyhow!("cannot watch `{}` (`components.dir`): {e}", dir.display()))?;
    Ok(watcher)
}
