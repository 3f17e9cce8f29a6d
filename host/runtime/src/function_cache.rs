//! Cranelift's incremental compilation cache, on disk: each function's compiled code, keyed by
//! what Cranelift compiled it from. A new version of a component recompiles only the
//! functions that changed. That matters for interpreted languages: an edit of a Python or
//! JavaScript handler changes its source, and with it the component's digest (so the
//! [`crate::CompileCache`] misses), but none of the interpreter's tens of thousands of
//! functions, which are almost all of the 18 MB to compile.
//!
//! An entry is `<dir>/<sha256 of the key>`, written to a temporary file and renamed, so a
//! reader never sees half an entry. The code is used unchecked, as the compile cache's is: the
//! directory is created with mode 0700, writable by this user only. Entries are never evicted:
//! a version adds only the functions it changed.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};
use wasmtime::CacheStore;

/// The function cache that goes with the compile cache in `cache_dir`: its `functions`
/// subdirectory.
pub fn beside(cache_dir: &Path) -> PathBuf {
    cache_dir.join("functions")
}

/// A directory of compiled functions (see the module docs).
#[derive(Debug)]
pub struct FunctionCache {
    dir: PathBuf,
}

impl FunctionCache {
    /// The cache in `dir`, created (mode 0700) if missing.
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    fn path(&self, key: &[u8]) -> PathBuf {
        self.dir.join(hex::encode(Sha256::digest(key)))
    }
}

/// Distinguishes the temporary files of concurrent inserts (compilation is parallel).
static NEXT_TEMP: AtomicU64 = AtomicU64::new(0);

impl CacheStore for FunctionCache {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        std::fs::read(self.path(key)).ok().map(Cow::Owned)
    }

    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        let path = self.path(key);
        let n = NEXT_TEMP.fetch_add(1, Ordering::Relaxed);
        // Named for the key as well: two processes sharing the directory with the same pid
        // (containers) can only collide on one key, whose code is the same for both; a
        // temporary name shared across keys could store one function's code under another's.
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("entry");
        let temp = (self.dir).join(format!(".tmp-{name}-{}-{n}", std::process::id()));
        let written = std::fs::write(&temp, &value).and_then(|()| std::fs::rename(&temp, &path));
        if written.is_err() {
            std::fs::remove_file(&temp).ok();
        }
        written.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inserted_function_is_found_again_by_its_key_only() {
        let dir = tempfile::tempdir().unwrap();
        let cache = FunctionCache::open(&dir.path().join("functions")).unwrap();
        assert!(cache.get(b"key").is_none());
        assert!(cache.insert(b"key", b"code".to_vec()));
        assert_eq!(cache.get(b"key").as_deref(), Some(&b"code"[..]));
        assert!(cache.get(b"other").is_none());
        let reopened = FunctionCache::open(&dir.path().join("functions")).unwrap();
        assert_eq!(reopened.get(b"key").as_deref(), Some(&b"code"[..]));
    }
}
