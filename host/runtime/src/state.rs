//! The per-invocation store data: WASI context, limits, log buffer and route configuration.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime::component::ResourceTable;
use wasmtime::ResourceLimiter;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::outcome::{LogLine, TrapKind};
use crate::limits::Limits;

/// How many bytes of a guest's stderr are kept (panic messages land there).
const STDERR_CAPACITY: usize = 8 << 10;

/// Where a route's read-only directory appears inside the guest.
pub const GUEST_DIR: &str = "/data";

/// Per-route settings for an invocation: its limits and its grants.
#[derive(Debug, Clone, Default)]
pub struct InvokeOptions {
    /// Resource limits.
    pub limits: Limits,
    /// The route's configuration values, visible through the `config` import.
    pub config: Arc<BTreeMap<String, String>>,
    /// Subject filters the outputs must match; an output outside them is a
    /// [`TrapKind::ForbiddenOutput`]. `None` allows any subject (local runs that publish
    /// nothing); the pipeline always sets it, empty by default.
    pub allowed_outputs: Option<Arc<[String]>>,
    /// A host directory the guest may read, mounted at [`super::state::GUEST_DIR`].
    pub read_only_dir: Option<Arc<PathBuf>>,
    /// The route's own share of the long-running lanes: a long runner needs one of these
    /// before one of the process's, so one route's long runners cannot queue every lane.
    /// `None`: only the process's lanes (local runs).
    pub route_lanes: Option<Arc<Semaphore>>,
    /// The route's outbound HTTP grant (`[routes.http]`); `None`: every call is refused.
    pub http: Option<crate::http::HttpGrant>,
    /// This run's call journal (set per message by the pipeline); `None` for local runs,
    /// which record nothing.
    pub journal: Option<dedup_delivery::journal::Journal>,
}

/// The thread CPU clock reading that starts a measured segment of guest execution, shared
/// between a guest's store and the future its epoch tick yields to.
#[derive(Debug, Clone)]
pub(crate) struct CpuMark(Arc<AtomicU64>);

/// No segment is being measured.
const NO_MARK: u64 = u64::MAX;

impl Default for CpuMark {
    fn default() -> Self {
        Self(Arc::new(AtomicU64::new(NO_MARK)))
    }
}

impl CpuMark {
    /// Starts a segment now, on the calling thread.
    pub(crate) fn set_now(&self) {
        let nanos = crate::cpu::thread_cpu()
            .as_nanos()
            .min(u128::from(NO_MARK - 1));
        self.0.store(nanos as u64, Ordering::Relaxed);
    }

    /// Ends the segment, returning where it started.
    fn take(&self) -> Option<Duration> {
        match self.0.swap(NO_MARK, Ordering::Relaxed) {
            NO_MARK => None,
            nanos => Some(Duration::from_nanos(nanos)),
        }
    }
}

/// Identifies the invocation in the host's logs.
#[derive(Debug, Clone, Default)]
pub struct LogContext {
    /// Route name.
    pub route: String,
    /// Idempotency key.
    pub key: String,
    /// Attempt number.
    pub attempt: u32,
}

/// Store data for one invocation. A fresh one is built for every call and dropped after it.
pub struct GuestState {
    /// The WASI context, built at the guest's first WASI call (most handler calls make none,
    /// and building one costs as much as a small guest's work: it seeds a random generator).
    /// Built at once when the route grants a directory, so a directory that cannot be opened
    /// fails the invocation before the guest runs.
    pub(crate) wasi: Option<WasiCtx>,
    pub(crate) table: ResourceTable,
    pub(crate) stderr: MemoryOutputPipe,
    pub(crate) config: Arc<BTreeMap<String, String>>,
    pub(crate) limits: Limits,
    pub(crate) started: Instant,
    /// When the wall-clock limit ([`Limits::wall_limit`]) runs out.
    pub(crate) wall_deadline: Instant,
    /// CPU time the guest has used in the segments measured so far.
    pub(crate) cpu_used: Duration,
    /// The thread's CPU clock when the current segment of guest execution began, in
    /// nanoseconds; [`NO_MARK`] while the guest is not known to be running on this thread
    /// (before its first epoch tick, in a host call, suspended). Shared with the future a tick
    /// yields to, which sets it on the thread that resumes the guest.
    pub(crate) cpu_mark: CpuMark,
    /// Whether the guest has reached an epoch tick: from then on its CPU time is measured
    /// (a guest done within its first tick costs no clock reads).
    pub(crate) measured: bool,
    /// The long-running lane this guest holds for the current tick, once it is a long runner:
    /// its route's lane permit and the process's. Empty while it waits or sits in a host call.
    pub(crate) lane: Arc<std::sync::Mutex<Vec<OwnedSemaphorePermit>>>,
    pub(crate) logs: Vec<LogLine>,
    pub(crate) log_bytes: u64,
    pub(crate) context: LogContext,
    /// The limit the guest broke, set by whichever hook noticed it; it classifies the trap.
    pub(crate) breach: Option<(TrapKind, String)>,
    /// The largest linear memory the guest asked for, in bytes.
    pub(crate) memory_peak: u64,
    /// Outbound HTTP (built at the guest's first `wasi:http` call).
    pub(crate) http: Option<crate::http::hooks::HttpState>,
    /// The grant and journal the HTTP state is built from.
    http_grant: Option<(
        Option<crate::http::HttpGrant>,
        Option<dedup_delivery::journal::Journal>,
    )>,
}

impl GuestState {
    /// A state with nothing granted but what `options` grants: no environment, arguments,
    /// sockets or name lookups; no files except the route's read-only directory, if any.
    /// Fails only if that directory cannot be opened.
    pub(crate) fn new(options: &InvokeOptions, context: LogContext) -> std::io::Result<Self> {
        let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
        let wasi = match &options.read_only_dir {
            Some(dir) => {
                let mut wasi = sandboxed(&stderr);
                wasi.preopened_dir(dir.as_path(), GUEST_DIR, FsPerms::ReadOnly)
                    .map_err(|e| {
                        std::io::Error::other(format!(
                            "cannot open read-only directory `{}`: {e:#}",
                            dir.display()
                        ))
                    })?;
                Some(wasi.build())
            }
            None => None,
        };
        let limits = options.limits.clone();
        let started = Instant::now();
        let wall_deadline = started + limits.wall_limit();
        Ok(Self {
            started,
            lane: Arc::default(),
            wasi,
            table: ResourceTable::new(),
            stderr,
            config: options.config.clone(),
            limits,
            wall_deadline,
            cpu_used: Duration::ZERO,
            cpu_mark: CpuMark::default(),
            measured: false,
            logs: Vec::new(),
            log_bytes: 0,
            context,
            breach: None,
            memory_peak: 0,
            http: None,
            http_grant: Some((options.http.clone(), options.journal.clone())),
        })
    }

    /// Ends the current measured segment (the guest calls into the host or is about to be
    /// suspended): its CPU time is added to `cpu_used`.
    pub(crate) fn cpu_pause(&mut self) {
        if let Some(mark) = self.cpu_mark.take() {
            self.cpu_used += crate::cpu::thread_cpu().saturating_sub(mark);
        }
    }

    /// Starts a measured segment on the calling thread (the guest runs again, here), once
    /// the guest is measured at all.
    pub(crate) fn cpu_resume(&mut self) {
        if self.measured {
            self.cpu_mark.set_now();
        }
    }

    /// At an epoch tick: adds the segment so far and returns the CPU time used. The caller
    /// resumes measuring after whatever suspension the tick causes.
    pub(crate) fn cpu_at_tick(&mut self) -> Duration {
        self.measured = true;
        self.cpu_pause();
        self.cpu_used
    }

    /// Records the first limit broken during this invocation.
    pub(crate) fn breach(&mut self, kind: TrapKind, message: String) -> wasmtime::Error {
        let err = wasmtime::Error::msg(message.clone());
        self.breach.get_or_insert((kind, message));
        err
    }

    /// The guest's stderr (a panic message, typically), trimmed.
    pub(crate) fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr.contents())
            .trim()
            .to_string()
    }
}

/// A WASI context builder that grants nothing but `stderr` (captured): no environment,
/// arguments, files, sockets or name lookups.
fn sandboxed(stderr: &MemoryOutputPipe) -> WasiCtxBuilder {
    let mut wasi = WasiCtxBuilder::new();
    wasi.stderr(stderr.clone())
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false);
    wasi
}

impl WasiView for GuestState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        let stderr = &self.stderr;
        WasiCtxView {
            ctx: self.wasi.get_or_insert_with(|| sandboxed(stderr).build()),
            table: &mut self.table,
        }
    }
}

impl wasmtime_wasi_http::WasiHttpView for GuestState {
    fn http(&mut self) -> wasmtime_wasi_http::WasiHttpCtxView<'_> {
        if self.http.is_none() {
            let (grant, journal) = self.http_grant.take().unwrap_or_default();
            let context = &self.context;
            let state =
                crate::http::hooks::HttpState::new(grant, journal, &context.route, &context.key);
            self.http = Some(state);
        }
        let state = self.http.as_mut().expect("built above");
        wasmtime_wasi_http::WasiHttpCtxView {
            ctx: &mut state.ctx,
            table: &mut self.table,
            hooks: &mut state.hooks,
        }
    }
}

impl ResourceLimiter for GuestState {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.memory_peak = self.memory_peak.max(desired as u64);
        if desired as u64 > self.limits.memory_bytes {
            let limit = self.limits.memory_bytes;
            return Err(self.breach(
                TrapKind::Memory,
                format!("linear memory would grow to {desired} bytes, over the limit of {limit}"),
            ));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired as u64 > self.limits.table_elements {
            let limit = self.limits.table_elements;
            return Err(self.breach(
                TrapKind::Memory,
                format!("table would grow to {desired} elements, over the limit of {limit}"),
            ));
        }
        Ok(true)
    }

    fn instances(&self) -> usize {
        self.limits.instances
    }

    fn tables(&self) -> usize {
        self.limits.tables
    }

    fn memories(&self) -> usize {
        self.limits.memories
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wasi_context_is_built_at_the_first_wasi_call_only() {
        let mut state =
            GuestState::new(&InvokeOptions::default(), LogContext::default()).expect("state");
        assert!(
            state.wasi.is_none(),
            "no WASI context before the guest asks"
        );
        let _ = state.ctx();
        assert!(state.wasi.is_some(), "the first WASI call builds it");
    }

    #[test]
    fn a_granted_directory_that_cannot_be_opened_fails_before_the_guest_runs() {
        let options = InvokeOptions {
            read_only_dir: Some(Arc::new(PathBuf::from("/nonexistent/dedup-state-test"))),
            ..InvokeOptions::default()
        };
        let err = GuestState::new(&options, LogContext::default())
            .err()
            .expect("the directory is refused");
        assert!(
            err.to_string().contains("cannot open read-only directory"),
            "{err}"
        );
    }
}
