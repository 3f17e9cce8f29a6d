//! The on-disk cache of compiled components, so a restart does not recompile unchanged ones.
//!
//! An entry is `<dir>/<digest of the component bytes>-<engine hash>.cwasm`, the engine hash
//! covering wasmtime's version and every setting that changes machine code. Entries are
//! written to a temporary file and renamed, so a reader never sees half an entry.
//!
//! Loading an entry runs its machine code unchecked: the directory must be writable by the
//! host only (it is created with mode 0700).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

use wasmtime::component::Component;
use wasmtime::Engine;

/// Where a component's compiled form came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compiled {
    /// Compiled now.
    Fresh,
    /// Read from the cache: no compilation happened.
    Cached,
}

/// A directory of compiled components for one engine configuration.
#[derive(Debug, Clone)]
pub struct CompileCache {
    dir: PathBuf,
    engine_hash: String,
}

impl CompileCache {
    /// A cache in `dir` (created if missing) for components compiled by `engine`.
    pub fn open(dir: &Path, engine: &Engine) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let mut hasher = DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        Ok(Self {
            dir: dir.to_path_buf(),
            engine_hash: format!("{:016x}", hasher.finish()),
        })
    }

    /// The entry file of a component digest (`sha256:<hex>`).
    pub fn entry(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        self.dir.join(format!("{hex}-{}.cwasm", self.engine_hash))
    }

    /// The cached component of `digest`, if there is a usable entry. A corrupt or
    /// incompatible entry is deleted and reported as missing.
    pub fn get(&self, engine: &Engine, digest: &str) -> Option<Component> {
        let path = self.entry(digest);
        // Read into memory rather than mapped: a file changed under a mapping would crash
        // the process (SIGBUS).
        let bytes = std::fs::read(&path).ok()?;
        // SAFETY: entries are only written by `put` below, from components this process
        // compiled, into a directory only the host may write; wasmtime also checks the
        // header and the engine configuration before using one.
        match unsafe { Component::deserialize(engine, &bytes) } {
            Ok(component) => Some(component),
            Err(e) => {
                tracing::warn!(path = %path.display(), "unusable compile-cache entry, recompiling: {e:#}");
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    /// Stores `component` under `digest`. Failures are logged, never fatal: the cache only
    /// saves time.
    pub fn put(&self, digest: &str, component: &Component) {
        let path = self.entry(digest);
        let result = component.serialize().and_then(|bytes| {
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, bytes)?;
            std::fs::rename(&tmp, &path)?;
            Ok(())
        });
        if let Err(e) = result {
            tracing::warn!(path = %path.display(), "cannot write compile-cache entry: {e:#}");
        }
    }
}
