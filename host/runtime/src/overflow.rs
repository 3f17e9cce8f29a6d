//! Instances the pool has no room for: the on-demand engine, and each handler's component
//! linked in it, made the first time one of its invocations overflows.

use std::sync::Arc;

use wasmtime::component::{Component, Linker};
use wasmtime::Engine;

use super::outcome::{Trap, TrapKind};
use super::state::GuestState;
use super::Handler;
use crate::bindings::HandlerGuestPre;

/// The on-demand engine (same code settings as the pooled one) and its linker.
pub(super) struct OnDemand {
    pub(super) engine: Engine,
    pub(super) linker: Arc<Linker<GuestState>>,
    /// The same plus `wasi:http`.
    pub(super) http_linker: Arc<Linker<GuestState>>,
    /// The largest linear memory a pool slot holds: an invocation allowed more (a route whose
    /// limit was raised by a reload) runs on demand.
    pub(super) pool_memory_bytes: u64,
}

impl Handler {
    /// Whether an invocation allowed `memory_bytes` per memory fits a pool slot.
    pub(super) fn fits_pool(&self, memory_bytes: u64) -> bool {
        memory_bytes <= self.inner.on_demand.pool_memory_bytes
    }

    /// This component linked in the on-demand engine. The compiled code moves over as
    /// wasmtime's own serialized form: both engines share every code setting, so it loads
    /// without compiling again (milliseconds, once per handler).
    pub(super) fn on_demand_pre(&self) -> Result<&HandlerGuestPre<GuestState>, Trap> {
        let made = self.inner.on_demand_pre.get_or_init(|| {
            let on_demand = &self.inner.on_demand;
            let bytes = self
                .inner
                .component
                .serialize()
                .map_err(|e| format!("{e:#}"))?;
            // SAFETY: the bytes were serialized just above by this process's own engine.
            let component = unsafe { Component::deserialize(&on_demand.engine, &bytes) }
                .map_err(|e| format!("{e:#}"))?;
            let linker = match self.inner.imports_http {
                true => &on_demand.http_linker,
                false => &on_demand.linker,
            };
            let pre = linker
                .instantiate_pre(&component)
                .map_err(|e| format!("{e:#}"))?;
            HandlerGuestPre::new(pre).map_err(|e| format!("{e:#}"))
        });
        made.as_ref().map_err(|reason| Trap {
            kind: TrapKind::PoolFull,
            message: format!(
                "instance pool full, and component `{}` could not be loaded outside it: {reason}",
                self.name()
            ),
        })
    }
}
