//! The floor, baseline (2d): what wasmtime itself needs to run a handler once. The same
//! component, compiled by the host's pooled engine (same pool and memory settings), is
//! instantiated from an `InstancePre` in the pooling allocator and called, and nothing else:
//! no fuel, no epoch deadline, no resource limiter, no WASI context (the guests' WASI imports
//! are linked as traps: a handler call does not reach them), no log capture; the two
//! `dedup:handler` imports a guest may call answer from a plain struct. Without fuel and
//! epochs the guest's machine code has no checks in it ([`FloorCode::Bare`]);
//! [`FloorCode::Armed`] compiles them in as the host does, which splits the host's distance
//! from (2d) into what its code settings cost and what the rest of the host costs.
//! `dedup-bench floor` times it beside the host's `invoke` of the same guest.

use std::time::{Duration, Instant};

use dedup_host::bindings::dedup::handler::{config, log, types};
use dedup_host::bindings::{Event, HandlerGuest, HandlerGuestPre};
use dedup_host::runtime::{EngineSettings, Runtime};
use wasmtime::component::{HasSelf, Linker};
use wasmtime::Store;

use super::{percentiles, time_invocations, us};
use crate::guests::guest;

/// The one thing a floor instance holds: the conformance guests' `mode` setting.
pub struct FloorState {
    mode: String,
}

impl types::Host for FloorState {}

impl log::Host for FloorState {
    fn log(
        &mut self,
        _level: log::Level,
        _message: String,
        _fields: Vec<(String, String)>,
    ) -> wasmtime::Result<()> {
        Ok(())
    }
}

impl config::Host for FloorState {
    fn get(&mut self, key: String) -> wasmtime::Result<Option<String>> {
        Ok((key == "mode").then(|| self.mode.clone()))
    }

    fn get_all(&mut self) -> wasmtime::Result<Vec<(String, String)>> {
        Ok(vec![("mode".into(), self.mode.clone())])
    }
}

/// Which machine code a floor runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloorCode {
    /// No epoch checks and no fuel metering compiled in: wasmtime's own floor, (2d).
    Bare,
    /// Epoch checks and fuel metering compiled in, as the host's engine does, with a deadline
    /// and a fuel budget no call reaches; still none of the rest of the host.
    Armed,
}

/// A component ready to be instantiated at the floor: its engine (kept alive by the runtime)
/// and its pre-instantiated form.
pub struct Floor {
    runtime: Runtime,
    pre: HandlerGuestPre<FloorState>,
    code: FloorCode,
}

/// Epoch ticks the armed floor's deadline lies ahead: never reached.
const NO_DEADLINE: u64 = 1 << 40;

impl Floor {
    /// Loads guest `name` (e.g. `conformance-rust`) with the host's pooled engine built from
    /// `settings`, compiled as `code` says, limits off.
    pub fn load(name: &str, settings: &EngineSettings, code: FloorCode) -> anyhow::Result<Self> {
        let runtime = Runtime::new(&EngineSettings {
            metered: code == FloorCode::Armed,
            ..settings.clone()
        })?;
        let handler = runtime.load_file(&guest(name))?;
        let mut linker = Linker::new(runtime.engine());
        HandlerGuest::add_to_linker::<_, HasSelf<_>>(&mut linker, |state| state)?;
        linker.define_unknown_imports_as_traps(handler.component())?;
        let pre = HandlerGuestPre::new(linker.instantiate_pre(handler.component())?)?;
        Ok(Self { runtime, pre, code })
    }

    /// One fresh store and instance, one call of the handler with `event`; the call must
    /// succeed.
    pub async fn call(&self, event: Event) -> anyhow::Result<()> {
        let mut store = Store::new(
            self.runtime.engine(),
            FloorState {
                mode: "upper".into(),
            },
        );
        if self.code == FloorCode::Armed {
            store.set_fuel(u64::MAX)?;
            store.set_epoch_deadline(NO_DEADLINE);
        }
        let guest = self.pre.instantiate_async(&mut store).await?;
        let outputs = guest
            .dedup_handler_handler()
            .call_handle(&mut store, &event)
            .await?;
        anyhow::ensure!(outputs.is_ok(), "floor: the guest failed: {outputs:?}");
        Ok(())
    }
}

/// The 1 KiB event the invocation benches hand a guest (number `i`).
pub fn event(i: usize) -> Event {
    Event {
        subject: "bench.in".into(),
        payload: vec![b'a'; 1024],
        headers: Vec::new(),
        key: format!("k{i}"),
        attempt: 1,
        fencing_token: 1,
        stream_sequence: i as u64,
        route: "bench".into(),
    }
}

/// Times `iterations` floor calls and as many host invocations of the Rust and the C
/// conformance guests (after a warm-up of 10 %); prints medians and the ratio invoke / (2d).
pub async fn run(iterations: usize) -> anyhow::Result<()> {
    println!("floor (2d) vs the host's invoke (conformance guest, mode upper, 1 KiB payload, {iterations} each):");
    for lang in ["rust", "c"] {
        let name = format!("conformance-{lang}");
        let floor = Floor::load(&name, &EngineSettings::default(), FloorCode::Bare)?;
        for i in 0..iterations / 10 {
            floor.call(event(i)).await?;
        }
        let mut samples: Vec<Duration> = Vec::with_capacity(iterations);
        for i in 0..iterations {
            let started = Instant::now();
            floor.call(event(i)).await?;
            samples.push(started.elapsed());
        }
        let floor_p = percentiles(&mut samples);
        let runtime = Runtime::new(&EngineSettings::default())?;
        let handler = runtime.load_file(&guest(&name))?;
        let mut host = time_invocations(&handler, &super::counts::upper(), iterations).await?;
        let host_p = percentiles(&mut host);
        println!(
            "  {lang:<5} floor median {:>7} us  p99 {:>7} us   invoke median {:>7} us  p99 {:>7} us   invoke/(2d) {:.2}",
            us(floor_p.p50),
            us(floor_p.p99),
            us(host_p.p50),
            us(host_p.p99),
            host_p.p50.as_secs_f64() / floor_p.p50.as_secs_f64()
        );
    }
    Ok(())
}
