//! The wasmtime engine: compiled once per process, tuned for many short invocations.

use std::time::Duration;

use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// How often the epoch advances. A running guest checks its deadline and yields to the async
/// executor at each tick, so this bounds how long a CPU-bound guest can hold a worker thread.
pub const EPOCH_TICK: Duration = Duration::from_millis(1);

/// Default number of guest instances that may be alive at once in one process.
pub const DEFAULT_MAX_INSTANCES: u32 = 256;

/// Default largest linear memory the instance pool reserves room for, per memory.
pub const DEFAULT_POOL_MEMORY_BYTES: u64 = 256 << 20;

/// How much of each kind of thing the instance pool holds. The host sizes it as the sum of
/// every route's share (its concurrency times its per-invocation limits, plus one for a trial
/// instantiation), so a route can never take space a neighbour needs.
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
        }
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

/// Process-wide engine settings.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// What the instance pool holds. Invocations beyond it trap with
    /// [`super::TrapKind::PoolFull`], an infrastructure condition.
    pub pool: PoolTotals,
    /// The largest linear memory any route may allow; per-route limits must not exceed it.
    pub max_memory_bytes: u64,
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
            max_memory_bytes: DEFAULT_POOL_MEMORY_BYTES,
            metered: true,
            long_running_lanes: default_lanes(),
            keep_resident_bytes: DEFAULT_KEEP_RESIDENT_BYTES,
        }
    }
}

/// Builds the engine (pooling allocator, epoch interruption); its epoch advances by
/// [`super::ticker::EpochTicker`].
pub fn build(settings: &EngineSettings) -> anyhow::Result<Engine> {
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
        .max_memory_size(settings.max_memory_bytes as usize)
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
        // Trap reasons come from the trap code and the guest's stderr; backtraces of
        // untrusted, usually stripped guests only cost time.
        .wasm_backtrace_max_frames(None)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Ok(Engine::new(&config)?)
}
