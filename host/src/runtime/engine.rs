//! The wasmtime engine: compiled once per process, tuned for many short invocations.

use std::time::Duration;

use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// How often the epoch advances. A running guest checks its deadline and yields to the async
/// executor at each tick, so this bounds how long a CPU-bound guest can hold a worker thread.
pub const EPOCH_TICK: Duration = Duration::from_millis(1);

/// Default number of guest instances that may be alive at once in one process.
pub const DEFAULT_MAX_INSTANCES: u32 = 256;

/// Default largest linear memory the instance pool reserves room for, per memory.
pub const DEFAULT_POOL_MEMORY_BYTES: u64 = 256 << 20;

/// Process-wide engine settings.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// Guest instances alive at once (pool slots). Invocations beyond it wait for a slot.
    pub max_instances: u32,
    /// The largest linear memory any route may allow; per-route limits must not exceed it.
    pub max_memory_bytes: u64,
    /// Enforce limits (deadline, fuel, memory, tables). Always on in the host; turning it off
    /// exists only to measure what the limits cost.
    pub metered: bool,
    /// How many guests that run past [`FAST_SLICE`] may execute at once. Such long runners
    /// take turns on these lanes one epoch tick at a time, so loops and heavy jobs cannot take
    /// every core from short handlers and the host's own work.
    pub long_running_lanes: usize,
}

/// A guest that has run this long is a long runner and needs a lane to go on.
pub const FAST_SLICE: Duration = Duration::from_millis(2);

/// The default number of long-running lanes: half the cores, at least one.
pub fn default_lanes() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            max_instances: DEFAULT_MAX_INSTANCES,
            max_memory_bytes: DEFAULT_POOL_MEMORY_BYTES,
            metered: true,
            long_running_lanes: default_lanes(),
        }
    }
}

/// Builds the engine (pooling allocator, epoch interruption) and starts its epoch ticker,
/// which stops by itself once the engine is dropped.
pub fn build(settings: &EngineSettings) -> anyhow::Result<Engine> {
    let mut pool = PoolingAllocationConfig::new();
    // A Rust or C guest is a handful of core instances (the program plus WASI adapters);
    // interpreted languages bring more.
    let instances = settings.max_instances;
    pool.total_component_instances(instances)
        .total_core_instances(instances * 8)
        .total_memories(instances * 2)
        .total_tables(instances * 4)
        .total_stacks(instances)
        .max_core_instances_per_component(64)
        .max_memories_per_component(8)
        .max_tables_per_component(16)
        .max_memory_size(settings.max_memory_bytes as usize)
        .max_component_instance_size(1 << 20)
        .max_core_instance_size(1 << 20);

    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .epoch_interruption(settings.metered)
        .consume_fuel(settings.metered)
        // Trap reasons come from the trap code and the guest's stderr; backtraces of
        // untrusted, usually stripped guests only cost time.
        .wasm_backtrace_max_frames(None)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    let engine = Engine::new(&config)?;

    let weak = engine.weak();
    std::thread::Builder::new()
        .name("wasm-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(EPOCH_TICK);
            }
        })?;
    Ok(engine)
}
