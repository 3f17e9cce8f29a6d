//! What `run` and `setup` check before they act: every route served from a component file
//! that exists now gets that file read, compiled and instantiated within the route's limits,
//! as a host would on loading it. A component that can never be served (not WebAssembly, a
//! core module, too big for the route's limits) then stops the command at once, naming the
//! route, the file and the fix, instead of a host starting and refusing the route later.

use anyhow::Context as _;
use thiserror::Error;

use crate::config::Config;
use crate::routes::Routes;
use crate::runtime::{EngineSettings, Runtime};

/// Routes whose component file can never be served, one problem each.
#[derive(Debug, Error)]
#[error("{} route(s) cannot be served: {}", .problems.len(), .problems.join("; "))]
pub struct Unservable {
    /// `route `name`: component `file`: why; the fix`, per route.
    pub problems: Vec<String>,
}

/// The runtime a host of `config` compiles and runs components with.
pub fn runtime(config: &Config) -> anyhow::Result<Runtime> {
    let cache = (config.components.cache_dir.as_ref()).map(|dir| config.resolve(dir));
    let mut runtime = Runtime::new(&EngineSettings {
        pool: config.pool(),
        long_running_lanes: config.lanes(),
        keep_resident_bytes: config.host.keep_resident_bytes,
        function_cache: cache.as_deref().map(crate::runtime::function_cache::beside),
        ..EngineSettings::default()
    })?;
    if let Some(dir) = cache {
        runtime = runtime.with_cache(&dir).with_context(|| {
            format!(
                "cannot use `{}` as the compile cache (`components.cache_dir`)",
                dir.display()
            )
        })?;
    }
    Ok(runtime)
}

/// Loads every route's component file that exists now (a route served from the object
/// store, or whose file is not there yet, is checked by the hosts when a version arrives).
pub async fn component_files(config: &Config) -> anyhow::Result<Result<(), Unservable>> {
    let runtime = runtime(config)?;
    let routes = Routes::unloaded(config)?;
    let mut problems = Vec::new();
    for route in routes.iter() {
        let Some(file) = route.component_file.clone() else {
            continue;
        };
        let Ok(bytes) = std::fs::read(&file) else {
            continue;
        };
        let origin = file.display().to_string();
        if let Err(reason) = super::install::check(&runtime, &route, &origin, bytes).await {
            problems.push(format!("route `{}`: {reason}", route.name));
        }
    }
    Ok(match problems.is_empty() {
        true => Ok(()),
        false => Err(Unservable { problems }),
    })
}
