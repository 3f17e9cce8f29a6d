//! Whether a host is alive and whether it is ready for work, as `/healthz` and `/readyz`
//! answer it. Ready means: NATS connected, set-up done, every route's consumer bound, every
//! route served or deliberately not served, and not draining.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use serde::Serialize;

use crate::routes::Routes;

/// What readiness depends on besides the routes.
#[derive(Debug, Default)]
pub struct Health {
    client: OnceLock<async_nats::Client>,
    set_up: AtomicBool,
    draining: AtomicBool,
    routes: OnceLock<Arc<Routes>>,
}

/// The answer of `/readyz`.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct Readiness {
    /// True when nothing is missing.
    pub ready: bool,
    /// What is missing, one sentence each.
    pub missing: Vec<String>,
    /// What needs an operator without making the host unready (it can still take work), one
    /// sentence each: messages stranded past their last delivery.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl Health {
    /// The connection is made.
    pub fn connected(&self, client: async_nats::Client) {
        let _ = self.client.set(client);
    }

    /// Streams, buckets and consumers exist; `routes` are the ones being served.
    pub fn set_up(&self, routes: Arc<Routes>) {
        let _ = self.routes.set(routes);
        self.set_up.store(true, Ordering::Relaxed);
    }

    /// Shutdown began: not ready any more, so load balancers stop sending work.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// What `/readyz` answers now.
    pub fn readiness(&self) -> Readiness {
        let mut missing = Vec::new();
        if self.draining.load(Ordering::Relaxed) {
            missing.push("shutting down: draining in-flight messages".to_string());
        }
        match self.client.get().map(|c| c.connection_state()) {
            Some(async_nats::connection::State::Connected) => {}
            Some(state) => missing.push(format!("NATS is not connected ({state})")),
            None => missing.push("NATS is not connected yet".to_string()),
        }
        if !self.set_up.load(Ordering::Relaxed) {
            missing.push("set-up of streams, buckets and consumers is not done".to_string());
        }
        for route in self.routes.get().into_iter().flat_map(|r| r.iter()) {
            if !route.metrics.bound() && route.contract_refused().is_none() {
                missing.push(format!("route `{}`: its consumer is not bound", route.name));
            }
            if let Some(reason) = route.contract_refused() {
                missing.push(format!("route `{}` is not served: {reason}", route.name));
            } else if !route.settled() {
                let why = match route.refused() {
                    Some(reason) => format!("its version was refused: {reason}"),
                    None => "its component is still loading".to_string(),
                };
                missing.push(format!("route `{}`: {why}", route.name));
            }
        }
        let mut warnings = Vec::new();
        let stranded = self.routes.get().map_or(0, |r| r.metrics().stranded());
        if stranded > 0 {
            warnings.push(format!("{stranded} message(s) past their last delivery are not dead-lettered yet (the dead-letter stream refused or was missing, or no host here serves their route under its contract); hosts retry them, `dedup-host audit` lists them"));
        }
        Readiness {
            ready: missing.is_empty(),
            missing,
            warnings,
        }
    }
}
