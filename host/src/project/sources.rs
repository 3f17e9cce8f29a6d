//! A project's sources as `dedup-host dev --watch` sees them: every file's modification time
//! and size, so a save is told from a second scan. Build output (`target/`, `node_modules/`,
//! the compile cache, components, lock files a build writes) is left out, or every build
//! would look like an edit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Directories that hold what builds and tools write, never what an author edits.
const SKIPPED_DIRS: &[&str] = &["target", "node_modules", "__pycache__", ".dedup-host"];

/// Files a build writes in the project's root (a dependency change comes with its manifest).
const SKIPPED_FILES: &[&str] = &["Cargo.lock", "package-lock.json"];

/// Extensions of files the build or the host writes (components, logs).
const SKIPPED_EXTENSIONS: &[&str] = &["wasm", "cwasm", "log"];

/// How deep the scan goes: a project is a few folders; a link loop must not hang the watch.
const MAX_DEPTH: usize = 8;

/// One scan of a project's sources: each file's modification time and size.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sources {
    files: BTreeMap<PathBuf, (Option<SystemTime>, u64)>,
}

impl Sources {
    /// Scans the sources under `dir` (hidden files and folders, build output and components
    /// left out). Files that vanish during the scan are skipped.
    pub fn scan(dir: &Path) -> Self {
        let mut sources = Sources::default();
        sources.walk(dir, 0);
        sources
    }

    fn walk(&mut self, dir: &Path, depth: usize) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') {
                continue;
            }
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            let path = entry.path();
            if meta.is_dir() {
                if depth < MAX_DEPTH && !SKIPPED_DIRS.contains(&name.as_ref()) {
                    self.walk(&path, depth + 1);
                }
                continue;
            }
            let built = SKIPPED_FILES.contains(&name.as_ref())
                || path
                    .extension()
                    .is_some_and(|x| SKIPPED_EXTENSIONS.iter().any(|s| x == *s));
            if !built {
                self.files.insert(path, (meta.modified().ok(), meta.len()));
            }
        }
    }

    /// The files that were added, removed or changed since `earlier`, for the line that says
    /// what the watch saw.
    pub fn changed_since(&self, earlier: &Sources) -> Vec<PathBuf> {
        let mut changed: Vec<PathBuf> = (self.files.iter())
            .filter(|(path, stamp)| earlier.files.get(*path) != Some(*stamp))
            .map(|(path, _)| path.clone())
            .collect();
        changed.extend(
            (earlier.files.keys())
                .filter(|path| !self.files.contains_key(*path))
                .cloned(),
        );
        changed
    }

    /// Takes `file` out of `changed` (paths as [`Sources::changed_since`] gives them, `file`
    /// as the user named it: each is compared by where it is, not how it is spelled); returns
    /// whether it was there.
    pub fn take_file(changed: &mut Vec<PathBuf>, file: &Path) -> bool {
        let file = located(file);
        let before = changed.len();
        changed.retain(|path| located(path) != file);
        changed.len() != before
    }

    /// How many files the scan holds.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Whether the scan found no file.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

/// Where `path` is: its canonical form, or its folder's joined with its name (a removed file).
fn located(path: &Path) -> PathBuf {
    if let Ok(path) = path.canonicalize() {
        return path;
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match (parent.canonicalize(), path.file_name()) {
        (Ok(parent), Some(name)) => parent.join(name),
        _ => path.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_edit_is_seen_and_build_output_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::create_dir_all(root.join("target/release")).unwrap();
        std::fs::write(root.join("src/lib.rs"), "fn a() {}").unwrap();
        std::fs::write(root.join("cases.toml"), "").unwrap();
        let before = Sources::scan(root);
        assert_eq!(before.len(), 2, "{before:?}");

        // What a build writes.
        std::fs::write(root.join("target/release/x.wasm"), "built").unwrap();
        std::fs::write(root.join("handler.wasm"), "built").unwrap();
        std::fs::write(root.join("Cargo.lock"), "lock").unwrap();
        std::fs::create_dir_all(root.join(".dedup-host/cache")).unwrap();
        std::fs::write(root.join(".dedup-host/cache/x.cwasm"), "code").unwrap();
        assert_eq!(Sources::scan(root), before);

        // An edit that keeps the size: the time tells it.
        let file = std::fs::File::options()
            .write(true)
            .open(root.join("src/lib.rs"))
            .unwrap();
        std::io::Write::write_all(&mut &file, b"fn b() {}").unwrap();
        file.set_modified(SystemTime::now() + std::time::Duration::from_secs(5))
            .unwrap();
        let after = Sources::scan(root);
        assert_ne!(after, before);
        assert_eq!(after.changed_since(&before), vec![root.join("src/lib.rs")]);

        std::fs::remove_file(root.join("cases.toml")).unwrap();
        let removed = Sources::scan(root);
        assert_eq!(removed.changed_since(&after), vec![root.join("cases.toml")]);
    }

    #[test]
    fn the_config_file_is_told_from_the_sources_however_it_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(root.join("host.toml"), "").unwrap();
        std::fs::write(root.join("src/lib.rs"), "").unwrap();
        // As the scan names them, the config as `--config` named it (with `..` in it).
        let mut changed = vec![root.join("host.toml"), root.join("src/lib.rs")];
        let named = root.join("src/../host.toml");
        assert!(Sources::take_file(&mut changed, &named));
        assert_eq!(changed, vec![root.join("src/lib.rs")]);
        assert!(!Sources::take_file(&mut changed, &named));
        assert_eq!(changed, vec![root.join("src/lib.rs")]);
        // A removed config is still recognised.
        std::fs::remove_file(root.join("host.toml")).unwrap();
        let mut changed = vec![root.join("host.toml")];
        assert!(Sources::take_file(&mut changed, &root.join("host.toml")));
        assert!(changed.is_empty());
    }
}
