//! Compile once: `build`, `test` and `deploy` load a component through one content-addressed
//! cache (the component's digest and the engine's precompile compatibility hash, see
//! [`crate::runtime::CompileCache`]), so `test` of a component `build` just checked, a second
//! `test` of an unchanged one, and `deploy` after `test` compile nothing. Each load logs
//! (at info: `RUST_LOG=dedup_host::cli::compile=info`) whether it compiled or took the
//! compiled code from the cache.
//!
//! The cache holds only code this machine compiled, in a directory only its user may write
//! (mode 0700): precompiled code from anywhere else (the object store) is never loaded, since
//! deserializing untrusted machine code would run it unchecked.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context as _;

use crate::runtime::{Compiled, EngineSettings, Handler, LoadError, Runtime};

/// Where the authoring commands keep compiled code, in a project folder (the host's default
/// `components.cache_dir` of a config in that folder).
pub(crate) const PROJECT_CACHE: &str = ".dedup-host/cache";

/// The runtime of the authoring commands (the default engine), caching compiled code in
/// `dir` when given.
pub(crate) fn runtime(dir: Option<&Path>) -> anyhow::Result<Runtime> {
    let runtime = Runtime::new(&EngineSettings {
        function_cache: dir.map(crate::runtime::function_cache::beside),
        ..EngineSettings::default()
    })?;
    match dir {
        None => Ok(runtime),
        Some(dir) => runtime.with_cache(dir).with_context(|| {
            format!(
                "cannot use `{}` as the compile cache: make it a directory this user may write, or remove it",
                dir.display()
            )
        }),
    }
}

/// The cache of the project folder `dir`.
pub(crate) fn project_cache(dir: &Path) -> PathBuf {
    dir.join(PROJECT_CACHE)
}

/// Loads the component `path` (its `bytes`) with `runtime` and logs whether it compiled.
pub(crate) fn load(runtime: &Runtime, path: &Path, bytes: &[u8]) -> Result<Handler, LoadError> {
    let started = Instant::now();
    let handler = runtime.load_bytes(path, bytes)?;
    // A log line, not output: scripts read what the commands print.
    match handler.compiled() {
        Compiled::Fresh => {
            tracing::info!("compiled `{}` in {:.1?}", path.display(), started.elapsed())
        }
        Compiled::Cached => tracing::info!(
            "`{}`: its machine code was loaded from the compile cache (this version was compiled earlier on this machine), nothing compiled now",
            path.display()
        ),
    }
    Ok(handler)
}

/// [`load`] of the file `path`.
pub(crate) fn load_file(runtime: &Runtime, path: &Path) -> Result<Handler, LoadError> {
    let bytes = std::fs::read(path).map_err(|error| LoadError::Read {
        path: path.to_path_buf(),
        error,
    })?;
    load(runtime, path, &bytes)
}
