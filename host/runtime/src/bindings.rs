//! Rust bindings for the `dedup:handler@0.1.0` WIT package (`wit/`), generated once here.

// Generated items carry the WIT doc comments where the WIT has them.
#![allow(missing_docs)]

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "handler-guest",
    // Host imports are synchronous and may trap: the log import traps once a guest exceeds
    // its per-invocation log budget.
    imports: {
        "dedup:handler/log": trappable,
        "dedup:handler/config": trappable,
        default: trappable,
    },
    // The handler export is called with `call_async` so epoch interruption can yield.
    exports: {
        default: async,
    },
    ownership: Owning,
});

pub use dedup::handler::log::Level;
pub use dedup::handler::types::{Event, Failure, Header, Output, RetryRequest};

/// The fully qualified name of the interface every handler component must export.
pub const HANDLER_EXPORT: &str = "dedup:handler/handler@0.1.0";

/// The interfaces of this package that the host provides to guests.
pub const HOST_INTERFACES: &[&str] = &[
    "dedup:handler/types@0.1.0",
    "dedup:handler/log@0.1.0",
    "dedup:handler/config@0.1.0",
];
