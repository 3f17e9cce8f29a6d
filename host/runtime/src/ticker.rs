//! The epoch ticker: advances the engine's epoch every [`EPOCH_TICK`] while a guest runs, so
//! running guests check their deadline and yield; it sleeps while none does, so an idle host
//! (or one of several host processes on a machine) wakes no core a thousand times a second.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::Thread;
use std::time::Duration;

use wasmtime::Engine;

use super::engine::EPOCH_TICK;

/// How often an idle ticker checks whether its engine was dropped.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// Counts the guests running on the process's engines and wakes its ticker for the first.
pub struct EpochTicker {
    running: AtomicUsize,
    thread: Thread,
}

/// One running guest; the ticker may sleep again once every guard is dropped.
pub struct Running(Arc<EpochTicker>);

impl EpochTicker {
    /// Starts ticking `engines` (the pooled and the on-demand one: a guest may run on
    /// either); the thread ends by itself once the first engine is dropped.
    pub fn start(engines: &[&Engine]) -> std::io::Result<Arc<Self>> {
        let weak: Vec<_> = engines.iter().map(|e| e.weak()).collect();
        let (tx, rx) = std::sync::mpsc::channel::<Arc<EpochTicker>>();
        let handle = std::thread::Builder::new()
            .name("wasm-epoch".into())
            .spawn(move || {
                let Ok(ticker) = rx.recv() else { return };
                loop {
                    // A full tick after waking too: a guest that woke the ticker runs a whole
                    // tick before its first yield, as it would beside a ticking one.
                    std::thread::sleep(EPOCH_TICK);
                    let Some(first) = weak.first().and_then(|w| w.upgrade()) else {
                        return;
                    };
                    drop(first);
                    for engine in weak.iter().filter_map(|w| w.upgrade()) {
                        engine.increment_epoch();
                    }
                    if ticker.running.load(Ordering::Acquire) == 0 {
                        // A guest starting now unparks: its wake-up is kept if it comes first.
                        std::thread::park_timeout(IDLE_CHECK);
                    }
                }
            })?;
        let ticker = Arc::new(Self {
            running: AtomicUsize::new(0),
            thread: handle.thread().clone(),
        });
        let _ = tx.send(ticker.clone());
        Ok(ticker)
    }

    /// Marks a guest as running until the guard is dropped; the first one wakes the ticker.
    pub fn enter(self: &Arc<Self>) -> Running {
        if self.running.fetch_add(1, Ordering::AcqRel) == 0 {
            self.thread.unpark();
        }
        Running(self.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}
