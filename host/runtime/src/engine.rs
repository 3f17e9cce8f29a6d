//! The wasmtime engine: compiled once per process, tuned for many short invocations.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// How often the epoch advances. A running guest checks its deadline and yields to the async
/// executor at each tick, so this bounds how long a CPU-bound guest can hold a worker thread.
pub const EPOCH_TICK: Duration = Duration::from_millis(1);

/// Default number of guest instances that may be alive at once in one process.
pub const DEFAULT_MAX_INSTANCES: u32 = 256;

/// The largest linear memory a route may allow (`limits.memory_bytes`).
pub const DEFAULT_POOL_MEMORY_BYTES: u64 = 256 << 20;

/// The smallest address-space reservation of one linear memory in the pool. Reservations are
/// rounded up to a power of two from here, so raising one route's memory limit a little
/// keeps the engine's code settings (and every compile-cache entry) as they were.
pub const MIN_MEMORY_RESERVATION: u64 = 64 << 20;

/// How much of each kind of thing the host-wide instance pool holds. Routes share it (see
/// `Config::pool`); an invocation that finds it full is instantiated outside it, on demand
/// ([`pool_overflows`]), so a full pool slows a message down but never refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolTotals {
    /// Component instances (one per invocation) alive at once.
    pub component_instances: u32,
    /// Core instances alive at once.
    pub core_instances: u32,
    /// Linear memories alive at once.
    pub memories: u32,
    /// Tables alive at once.
    pub tables: u32,
    /// The most core instances, memories and tables one component may have.
    pub per_component: (u32, u32, u32),
    /// The largest linear memory any slot holds: the largest memory limit configured. Each
    /// pooled memory reserves [`memory_reservation`] of this plus a guard region of address
    /// space; an invocation allowed more runs outside the pool.
    pub memory_bytes: u64,
}

impl PoolTotals {
    /// A pool for `instances` invocations of typical components (local runs and tests).
    pub fn for_instances(instances: u32) -> Self {
        Self {
            component_instances: instances,
            core_instances: instances * 8,
            memories: instances * 2,
            tables: instances * 4,
            per_component: (64, 8, 16),
            // A route's default limit: the memory reservation is a code setting, so the
            // authoring commands (`test`, `build`, `invoke`) then compile exactly what a host
            // with default limits runs, and a host finds their compile-cache entries.
            memory_bytes: crate::limits::DEFAULT_MEMORY_BYTES,
        }
    }

    /// The address space the pool's linear memories reserve up front: every memory slot's
    /// reservation plus its guard region.
    pub fn reserved_bytes(&self) -> u64 {
        u64::from(self.memories) * (memory_reservation(self.memory_bytes) + MEMORY_GUARD_BYTES)
    }

    /// Adds `slots` invocations each allowed `core_instances`, `memories` and `tables`.
    pub fn add_share(&mut self, slots: u32, core_instances: u32, memories: u32, tables: u32) {
        self.component_instances += slots;
        self.core_instances += slots * core_instances;
        self.memories += slots * memories;
        self.tables += slots * tables;
        let (i, m, t) = self.per_component;
        self.per_component = (i.max(core_instances), m.max(memories), t.max(tables));
    }
}

/// The guard region after each linear memory (wasmtime's default on 64-bit hosts): accesses
/// at constant offsets below it need no bounds check of their own.
pub const MEMORY_GUARD_BYTES: u64 = 32 << 20;

/// The address space reserved for one linear memory that may grow to `memory_bytes`: the
/// next power of two, at least [`MIN_MEMORY_RESERVATION`]. Not wasmtime's 4 GiB default,
/// which at hundreds of routes asked for more than x86-64's 128 TB of user address space;
/// the price is an explicit bounds check on memory accesses the guard does not cover.
pub fn memory_reservation(memory_bytes: u64) -> u64 {
    memory_bytes
        .max(MIN_MEMORY_RESERVATION)
        .checked_next_power_of_two()
        .unwrap_or(u64::MAX)
}

/// Process-wide engine settings.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// What the instance pool holds. Invocations beyond it are instantiated on demand.
    pub pool: PoolTotals,
    /// Enforce limits (deadline, fuel, memory, tables). Always on in the host; turning it off
    /// exists only to measure what the limits cost.
    pub metered: bool,
    /// How many guests that run past [`FAST_SLICE`] may execute at once. Such long runners
    /// take turns on these lanes one epoch tick at a time, so loops and heavy jobs cannot take
    /// every core from short handlers and the host's own work.
    pub long_running_lanes: usize,
    /// How much of each linear memory a freed pool slot keeps mapped, resetting only the
    /// pages the last instance wrote (found with Linux's `PAGEMAP_SCAN`; without it, the
    /// lowest bytes) instead of giving them back to the kernel. The next instance in the slot
    /// then takes no page faults on them, and no TLB shootdown is needed between cores: what
    /// makes big guests (Python, JavaScript heaps) cheap to instantiate. Costs up to this much
    /// resident memory per slot in use. Zero gives every page back.
    pub keep_resident_bytes: usize,
    /// Where Cranelift keeps each compiled function ([`crate::function_cache`]), so a new
    /// version of a component compiles only the functions that changed. None: compile
    /// everything every time.
    pub function_cache: Option<std::path::PathBuf>,
    /// Compile for this target triple (e.g. `x86_64-unknown-linux-gnu`) with its baseline
    /// features instead of the features detected on this CPU. None (the host's choice):
    /// detect. Exists for the instruction-count benches: code compiled outside valgrind
    /// then loads under it (which reports other CPU features) from the same cache entry.
    pub target: Option<String>,
}

/// The default [`EngineSettings::keep_resident_bytes`]: room for an interpreter's working
/// set (a Python or JavaScript invocation writes a few MiB of its heap).
pub const DEFAULT_KEEP_RESIDENT_BYTES: usize = 16 << 20;

/// A guest that has run this long is a long runner and needs a lane to go on.
pub const FAST_SLICE: Duration = Duration::from_millis(2);

/// The default number of long-running lanes: half the cores, at least one.
pub fn default_lanes() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            pool: PoolTotals::for_instances(DEFAULT_MAX_INSTANCES),
            metered: true,
            long_running_lanes: default_lanes(),
            keep_resident_bytes: DEFAULT_KEEP_RESIDENT_BYTES,
            function_cache: None,
            target: None,
        }
    }
}

/// The process's two engines, built with the same code settings so a component compiled for
/// one loads into the other: the pooled engine every invocation tries first, and an
/// on-demand engine for invocations the pool has no room for.
pub struct Engines {
    /// Instances come from the preallocated pool (fast, bounded).
    pub pooled: Engine,
    /// Instances are mapped and unmapped per invocation (slower, unbounded).
    pub on_demand: Engine,
}

/// Builds both engines (epoch interruption; their epochs advance by
/// [`super::ticker::EpochTicker`]).
pub fn build(settings: &EngineSettings) -> anyhow::Result<Engines> {
    let mut pool = PoolingAllocationConfig::new();
    // A Rust or C guest is a handful of core instances (the program plus WASI adapters);
    // interpreted languages bring more.
    let totals = settings.pool;
    let (core_instances, memories, tables) = totals.per_component;
    pool.total_component_instances(totals.component_instances)
        .total_core_instances(totals.core_instances)
        .total_memories(totals.memories)
        .total_tables(totals.tables)
        .total_stacks(totals.component_instances)
        .max_core_instances_per_component(core_instances)
        .max_memories_per_component(memories)
        .max_tables_per_component(tables)
        // A module may define several memories (multi-memory) within the component's share.
        .max_memories_per_module(memories)
        .max_tables_per_module(tables)
        // The whole reservation, not the largest route limit: a route's own limit is enforced
        // at instantiation by its resource limiter, with a message naming the route, where a
        // pool limit below a module's minimum would refuse it at compile time.
        .max_memory_size(
            usize::try_from(memory_reservation(totals.memory_bytes)).unwrap_or(usize::MAX),
        )
        .max_component_instance_size(1 << 20)
        .max_core_instance_size(1 << 20)
        .linear_memory_keep_resident(settings.keep_resident_bytes)
        .table_keep_resident(settings.keep_resident_bytes.min(1 << 20))
        .pagemap_scan(Enabled::Auto);

    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .epoch_interruption(settings.metered)
        .consume_fuel(settings.metered)
        // Both engines compile the same code: the reservation and guard are code settings.
        .memory_reservation(memory_reservation(totals.memory_bytes))
        .memory_guard_size(MEMORY_GUARD_BYTES)
        // Trap reasons come from the trap code and the guest's stderr; backtraces of
        // untrusted, usually stripped guests only cost time.
        .wasm_backtrace_max_frames(None);
    if let Some(target) = &settings.target {
        config.target(target).map_err(|e| {
            anyhow::anyhow!("cannot compile for target `{target}`: {e}; name a target triple wasmtime supports, such as x86_64-unknown-linux-gnu")
        })?;
    }
    if let Some(dir) = &settings.function_cache {
        let store = crate::function_cache::FunctionCache::open(dir).map_err(|e| {
            anyhow::anyhow!(
                "cannot use `{}` as the compiled-function cache: {e}; make it a directory this user may write",
                dir.display()
            )
        })?;
        config.enable_incremental_compilation(std::sync::Arc::new(store))?;
    }
    let on_demand = Engine::new(&config)?;
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    let pooled = Engine::new(&config).map_err(|e| {
        anyhow::anyhow!(
            "cannot reserve the instance pool ({} memories of {} MiB plus a {} MiB guard, {} GiB of address space): {e:#}; lower routes' limits.memory_bytes or limits.memories",
            totals.memories,
            memory_reservation(totals.memory_bytes) >> 20,
            MEMORY_GUARD_BYTES >> 20,
            totals.reserved_bytes() >> 30,
        )
    })?;
    Ok(Engines { pooled, on_demand })
}

static POOL_OVERFLOWS: AtomicU64 = AtomicU64::new(0);

/// Invocations (and trial instantiations) in this process that found the instance pool full
/// and were instantiated on demand instead (`dedup_pool_overflow_total`).
pub fn pool_overflows() -> u64 {
    POOL_OVERFLOWS.load(Ordering::Relaxed)
}

/// Counts one instantiation outside the pool; the first is logged with what to do about it.
pub(super) fn count_overflow(component: &str) {
    if POOL_OVERFLOWS.fetch_add(1, Ordering::Relaxed) == 0 {
        tracing::warn!(
            "instance pool full (first overflow: component `{component}`): instantiating outside it, on demand, which is slower; dedup_pool_overflow_total counts these. Lower routes' concurrency if it keeps rising"
        );
    }
}
