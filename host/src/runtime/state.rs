//! The per-invocation store data: WASI context, limits, log buffer and route configuration.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use wasmtime::component::ResourceTable;
use wasmtime::ResourceLimiter;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::outcome::{LogLine, TrapKind};
use crate::limits::Limits;

/// How many bytes of a guest's stderr are kept (panic messages land there).
const STDERR_CAPACITY: usize = 8 << 10;

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
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) stderr: MemoryOutputPipe,
    pub(crate) config: Arc<BTreeMap<String, String>>,
    pub(crate) limits: Limits,
    pub(crate) deadline: Instant,
    pub(crate) logs: Vec<LogLine>,
    pub(crate) log_bytes: u64,
    pub(crate) context: LogContext,
    /// The limit the guest broke, set by whichever hook noticed it; it classifies the trap.
    pub(crate) breach: Option<(TrapKind, String)>,
}

impl GuestState {
    /// A state with nothing granted: no files, environment, arguments or sockets.
    pub(crate) fn new(
        config: Arc<BTreeMap<String, String>>,
        limits: Limits,
        context: LogContext,
    ) -> Self {
        let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
        let wasi = WasiCtxBuilder::new().stderr(stderr.clone()).build();
        let deadline = Instant::now() + limits.deadline;
        Self {
            wasi,
            table: ResourceTable::new(),
            stderr,
            config,
            limits,
            deadline,
            logs: Vec::new(),
            log_bytes: 0,
            context,
            breach: None,
        }
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

impl WasiView for GuestState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
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
}
