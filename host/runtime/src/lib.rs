//! dedup-host's WebAssembly runtime: one engine and linker per process, one compiled
//! [`Handler`] per component, and a fresh store per invocation. It knows nothing of claims,
//! streams or routes: the host's pipeline hands it an event and gets an [`Outcome`].
//!
//! - [`bindings`]: the Rust side of the WIT contract in `wit/` (the one `bindgen!`).
//! - [`engine`], [`cache`], [`load`]: the engines (a pool, and on demand), compiled code
//!   cached on disk, loading and validating components.
//! - [`state`], [`outcome`], [`outputs`]: one invocation's store and limits, what it returned,
//!   and the sandbox boundary its outputs cross.
//! - [`http`]: outbound HTTP (`wasi:http`) for routes that grant it: allowlist, limits,
//!   journal, the host's own client.
//! - [`host_api`]: the imports guests may call (logging, route configuration); [`limits`]:
//!   per-invocation resource limits, with [`size`] and [`durations`] to read them; [`cpu`]:
//!   CPU clocks.

#![warn(missing_docs)]

pub mod bindings;
pub mod cpu;
pub mod durations;
pub mod host_api;
pub mod http;
pub mod limits;
pub mod size;

pub mod cache;
pub mod engine;
pub mod function_cache;
pub mod inline;
mod invoke;
pub mod load;
pub mod outcome;
pub mod outputs;
mod overflow;
pub mod state;
pub mod ticker;

use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use wasmtime::component::{Component, Linker};
use wasmtime::Engine;

use crate::bindings::HandlerGuestPre;
pub use cache::{CompileCache, Compiled};
pub use engine::{pool_overflows, EngineSettings};
pub use load::LoadError;
pub use outcome::{Invocation, LogLine, Outcome, Trap, TrapKind};
use overflow::OnDemand;
use state::GuestState;
pub use state::InvokeOptions;
use ticker::EpochTicker;

/// The process's wasmtime engines (pooled, and on demand for what the pool has no room
/// for) and the linker holding every host import.
#[derive(Clone)]
pub struct Runtime {
    engine: Engine,
    on_demand: Arc<OnDemand>,
    cache: Option<CompileCache>,
    metered: bool,
    lanes: Arc<Semaphore>,
    /// Advances the epoch while guests run (metered engines only).
    ticker: Option<Arc<EpochTicker>>,
    linker: Arc<Linker<GuestState>>,
    /// The same plus `wasi:http`, for components that import it (served only on routes that
    /// grant it: see [`Handler::imports_http`]).
    http_linker: Arc<Linker<GuestState>>,
}

impl Runtime {
    /// Builds the engines and links WASI 0.2 plus the `dedup:handler` imports.
    pub fn new(settings: &EngineSettings) -> anyhow::Result<Self> {
        let engine::Engines { pooled, on_demand } = engine::build(settings)?;
        let linker = link_imports(&pooled, false)?;
        let http_linker = link_imports(&pooled, true)?;
        let ticker = match settings.metered {
            true => Some(EpochTicker::start(&[&pooled, &on_demand])?),
            false => None,
        };
        let on_demand = OnDemand {
            linker: Arc::new(link_imports(&on_demand, false)?),
            http_linker: Arc::new(link_imports(&on_demand, true)?),
            engine: on_demand,
            pool_memory_bytes: settings.pool.memory_bytes,
        };
        Ok(Self {
            engine: pooled,
            on_demand: Arc::new(on_demand),
            ticker,
            cache: None,
            metered: settings.metered,
            lanes: Arc::new(Semaphore::new(settings.long_running_lanes.max(1))),
            linker: Arc::new(linker),
            http_linker: Arc::new(http_linker),
        })
    }

    /// Keeps compiled components in `dir`, so loading an unchanged component again (after a
    /// restart, say) skips compilation.
    pub fn with_cache(mut self, dir: &Path) -> std::io::Result<Self> {
        self.cache = Some(CompileCache::open(dir, &self.engine)?);
        Ok(self)
    }

    /// The wasmtime engine components are compiled for (the pooled one).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Reads, compiles and checks the component at `path`.
    pub fn load_file(&self, path: &Path) -> Result<Handler, LoadError> {
        let bytes = std::fs::read(path).map_err(|error| LoadError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        self.load_bytes(path, &bytes)
    }

    /// Compiles and checks a component whose bytes are already in memory; `path` names it
    /// in errors (a `.wat` extension allows WebAssembly text).
    pub fn load_bytes(&self, path: &Path, bytes: &[u8]) -> Result<Handler, LoadError> {
        self.load_digested(path, bytes, digest(bytes))
    }

    /// Like [`Runtime::load_bytes`], for a caller that already has the bytes' [`digest`]
    /// (hashing an 18 MB component twice is not free).
    pub fn load_digested(
        &self,
        path: &Path,
        bytes: &[u8],
        digest: String,
    ) -> Result<Handler, LoadError> {
        let cached = self
            .cache
            .as_ref()
            .and_then(|c| c.get(&self.engine, &digest));
        let (component, compiled) = match cached {
            Some(component) => (component, Compiled::Cached),
            None => (load::compile(&self.engine, path, bytes)?, Compiled::Fresh),
        };
        let handler = self.link(path, component, digest, compiled)?;
        if let (Some(cache), Compiled::Fresh) = (&self.cache, compiled) {
            cache.put(handler.digest(), handler.component());
        }
        Ok(handler)
    }

    /// Checks and links an already compiled component.
    fn link(
        &self,
        path: &Path,
        component: Component,
        digest: String,
        compiled: Compiled,
    ) -> Result<Handler, LoadError> {
        let imports = load::check_contract(&self.engine, path, &component)?;
        let link_err = |e: wasmtime::Error| LoadError::Link {
            path: path.to_path_buf(),
            message: format!("{e:#}"),
        };
        let linker = match imports.http {
            true => &self.http_linker,
            false => &self.linker,
        };
        let instance_pre = linker.instantiate_pre(&component).map_err(link_err)?;
        let pre = HandlerGuestPre::new(instance_pre).map_err(link_err)?;
        Ok(Handler {
            inner: Arc::new(HandlerInner {
                name: path.display().to_string(),
                digest,
                component,
                compiled,
                pre,
                imports_http: imports.http,
                on_demand: self.on_demand.clone(),
                on_demand_pre: std::sync::OnceLock::new(),
                metered: self.metered,
                lanes: self.lanes.clone(),
                ticker: self.ticker.clone(),
            }),
        })
    }
}

/// A linker for `engine` with WASI 0.2 and the `dedup:handler` imports, and `wasi:http`
/// when `http`.
fn link_imports(engine: &Engine, http: bool) -> anyhow::Result<Linker<GuestState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    if http {
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
    }
    crate::bindings::HandlerGuest::add_to_linker::<_, wasmtime::component::HasSelf<_>>(
        &mut linker,
        |state| state,
    )?;
    Ok(linker)
}

/// The `sha256:<hex>` digest of a component's bytes, which identifies a version.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A compiled, linked, validated component, ready to be instantiated per invocation.
/// Cheap to clone.
#[derive(Clone)]
pub struct Handler {
    inner: Arc<HandlerInner>,
}

struct HandlerInner {
    name: String,
    digest: String,
    component: Component,
    compiled: Compiled,
    pre: HandlerGuestPre<GuestState>,
    /// Whether the component imports `wasi:http` (and was linked with it).
    imports_http: bool,
    /// Where instances go when the pool has no room for them.
    on_demand: Arc<OnDemand>,
    /// This component linked in the on-demand engine, made at its first overflow.
    on_demand_pre: std::sync::OnceLock<Result<HandlerGuestPre<GuestState>, String>>,
    metered: bool,
    /// The process's long-running lanes (see [`EngineSettings::long_running_lanes`]).
    lanes: Arc<Semaphore>,
    /// Woken while one of this handler's instances runs.
    ticker: Option<Arc<EpochTicker>>,
}

impl Handler {
    /// Where the component came from (its path), for messages.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The `sha256:` digest of the component's bytes.
    pub fn digest(&self) -> &str {
        &self.inner.digest
    }

    /// Whether this load compiled the component or took it from the cache.
    pub fn compiled(&self) -> Compiled {
        self.inner.compiled
    }

    /// Whether the component imports `wasi:http`: only a route granting outbound HTTP
    /// (`[routes.http]`) may serve it.
    pub fn imports_http(&self) -> bool {
        self.inner.imports_http
    }

    /// The compiled component (for serializing it to a cache).
    pub fn component(&self) -> &Component {
        &self.inner.component
    }
}

impl std::fmt::Debug for Handler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handler")
            .field("name", &self.name())
            .field("digest", &self.digest())
            .finish()
    }
}
