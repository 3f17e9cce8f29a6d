//! The host's modules import each other one way only: no module imports one that imports it
//! back, at the level of the crate's top modules and of sibling files within one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use dedup_host_tests::guests::workspace_root;

/// Every `.rs` file under `dir`, as (path relative to `src`, text).
fn sources(dir: &Path, src: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, src, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(src).unwrap().display().to_string();
            out.push((rel, std::fs::read_to_string(&path).unwrap()));
        }
    }
}

/// The module names `text` refers to after `prefix` (`crate::`, `super::`), outside comments.
fn referenced(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for (i, _) in line.match_indices(prefix) {
            let rest = &line[i + prefix.len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if !name.is_empty() {
                names.insert(name);
            }
        }
    }
    names
}

fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for (a, targets) in edges {
        for b in targets {
            if a < b && edges.get(b).is_some_and(|t| t.contains(a)) {
                found.push((a.clone(), b.clone()));
            }
        }
    }
    found
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let src = workspace_root().join("host/src");
    let mut files = Vec::new();
    sources(&src, &src, &mut files);
    // Top modules: `pipeline/consume.rs` belongs to `pipeline`, `serve.rs` to `serve`;
    // sibling files inside one directory, through `super::`.
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, text) in &files {
        let module = rel.split('/').next().unwrap().trim_end_matches(".rs");
        let refs = referenced(text, "crate::");
        top.entry(module.to_string())
            .or_default()
            .extend(refs.into_iter().filter(|m| m != module));
    }
    assert_eq!(circles(&top), Vec::<(String, String)>::new(), "top modules");
    assert_eq!(
        circles(&siblings(&files)),
        Vec::<(String, String)>::new(),
        "sibling files"
    );
}

/// Sibling files inside one directory and what each refers to through `super::`.
fn siblings(files: &[(String, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let mut siblings: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, text) in files {
        if let Some((dir, file)) = rel.rsplit_once('/') {
            let me = format!("{dir}/{}", file.trim_end_matches(".rs"));
            let targets: Vec<String> = referenced(text, "super::")
                .into_iter()
                .map(|m| format!("{dir}/{m}"))
                .filter(|t| *t != me)
                .collect();
            siblings.entry(me).or_default().extend(targets);
        }
    }
    siblings
}

/// The simulation's modules and the delivery crate's import one another one way too: the
/// simulation's adapters of the host's seams sit over one host context, not over each other.
#[test]
fn the_simulations_and_the_delivery_logics_files_import_one_another_one_way_only() {
    for (dir, under) in [("tests/src", "sim/"), ("host/delivery/src", "")] {
        let src = workspace_root().join(dir);
        let mut files = Vec::new();
        sources(&src, &src, &mut files);
        files.retain(|(rel, _)| rel.starts_with(under));
        assert!(files.len() > 10, "{dir}/{under}: {} files", files.len());
        assert_eq!(
            circles(&siblings(&files)),
            Vec::<(String, String)>::new(),
            "sibling files under {dir}/{under}"
        );
    }
}

/// The packages `Cargo.lock` says `package` depends on, directly or not.
fn locked_dependencies(lock: &str, package: &str) -> BTreeSet<String> {
    let mut deps: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in lock.split("[[package]]").skip(1) {
        let field = |key: &str| {
            entry
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.trim().trim_matches('"').to_string())
        };
        let name = field("name = ").expect("a locked package has a name");
        let listed = entry
            .split_once("dependencies = [")
            .map(|(_, rest)| rest.split_once(']').map_or(rest, |(list, _)| list))
            .unwrap_or("");
        // `"name"` or `"name version"`: the name is the first word.
        let names = listed
            .split(',')
            .filter_map(|d| d.trim().trim_matches('"').split(' ').next())
            .filter(|d| !d.is_empty())
            .map(str::to_string);
        deps.entry(name).or_default().extend(names);
    }
    let (mut seen, mut todo) = (BTreeSet::new(), vec![package.to_string()]);
    while let Some(p) = todo.pop() {
        for d in deps.get(&p).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

#[test]
fn the_delivery_logic_depends_on_neither_the_nats_client_nor_the_wasm_runtime() {
    let root = workspace_root();
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).unwrap();
    let deps = locked_dependencies(&lock, "dedup-delivery");
    for banned in ["async-nats", "wasmtime", "dedup-host"] {
        assert!(
            !deps.contains(banned),
            "dedup-delivery (host/delivery) depends on {banned}: its I/O comes in through its \
             own traits (DESIGN.md rule 25); put the adapter in the host crate"
        );
    }
    // The check itself sees dependencies: the host crate reaches both.
    let host = locked_dependencies(&lock, "dedup-host");
    assert!(
        host.contains("async-nats") && host.contains("wasmtime") && host.contains("dedup-delivery")
    );
    let mut files = Vec::new();
    let src = root.join("host/delivery/src");
    sources(&src, &src, &mut files);
    for (rel, text) in &files {
        for banned in ["async_nats", "wasmtime", "dedup_host"] {
            assert!(
                !text.contains(banned),
                "host/delivery/src/{rel} names {banned}"
            );
        }
    }
}

/// Whether `name` is a variable cargo (or nextest) sets for the test it runs, describing the
/// test's own package (`CARGO_MANIFEST_DIR=.../tests`, `CARGO_PKG_NAME`, ...). A cargo started
/// from the test inherits them, and build scripts that watch them (`ring`'s
/// `rerun-if-env-changed=CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, `OUT_DIR`, `CARGO_CFG_*`;
/// `rustix`'s `CARGO_CFG_*`, `CARGO_FEATURE_*`) then count as changed: cargo rebuilt them and
/// everything above, relinking the test binaries while the suite was running them (CI saw 14
/// tests fail with "No such file or directory" at their start). The test also runs alone
/// (`.config/nextest.toml`), so a rebuild it still caused would relink nothing in use.
fn set_for_the_test(name: &str) -> bool {
    const PREFIXES: [&str; 7] = [
        "CARGO_PKG_",
        "CARGO_BIN_",
        "CARGO_MANIFEST_",
        "CARGO_CRATE_",
        "CARGO_PRIMARY_",
        "CARGO_CFG_",
        "CARGO_FEATURE_",
    ];
    PREFIXES.iter().any(|p| name.starts_with(p))
        || ["CARGO_TARGET_TMPDIR", "CARGO_RUSTC_CURRENT_DIR", "OUT_DIR"].contains(&name)
}

/// Every library cargo builds for `args` (a build whose units are fresh compiles nothing and
/// only reports them): package, target and the files it makes. Fails if cargo compiled
/// anything: both builds have run before the tests, and a compile here would relink binaries
/// other tests are running.
fn built_libraries(args: &[&str]) -> BTreeSet<String> {
    let mut cargo = std::process::Command::new(env!("CARGO"));
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_for_the_test) {
            cargo.env_remove(name);
        }
    }
    let out = cargo
        .current_dir(workspace_root())
        .args(args)
        .args(["--release", "--workspace", "--message-format", "json"])
        .output()
        .expect("run cargo");
    assert!(
        out.status.success(),
        "cargo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut libraries = BTreeSet::new();
    let mut compiled = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let target = &message["target"];
        if message["reason"] == "compiler-artifact" && message["fresh"] != true {
            compiled.push(format!("{} {}", message["package_id"], target["name"]));
        }
        let kinds = target["kind"].to_string();
        if message["reason"] != "compiler-artifact"
            || kinds.contains("bin")
            || kinds.contains("test")
        {
            continue;
        }
        // The files' names carry cargo's hash of everything that makes a build differ
        // (features, profile, target): another name is another compile.
        libraries.insert(format!(
            "{} {} {}",
            message["package_id"], target["name"], message["filenames"]
        ));
    }
    assert!(
        compiled.is_empty(),
        "cargo {args:?} compiled again: {compiled:#?}\nBuild first (`cargo build --release --workspace --bins`, then the tests, as tests/run.sh does); if that was done, a variable of this test's environment makes cargo rebuild: leave it out in `set_for_the_test`"
    );
    libraries
}

/// One build (issue 46): `bash host/demo.sh` builds the binaries (`--workspace --bins`, no
/// dev-dependencies) and `bash tests/run.sh` then builds the tests (what `cargo nextest`
/// runs), which bring the dev-dependencies. A dev-dependency that turned on one more feature of
/// a package the binaries use (wasmtime, tokio, ...) would compile that package, and
/// everything above it, a second time: about 15 minutes for wasmtime on these machines. Both
/// builds have run when this test runs, so asking cargo again compiles nothing.
#[test]
fn the_binaries_and_the_tests_build_every_shared_library_once() {
    let binaries = built_libraries(&["build", "--bins"]);
    let tests = built_libraries(&["test", "--no-run"]);
    assert!(
        binaries.len() > 100,
        "cargo reported too few libraries: {binaries:#?}"
    );
    let differ: Vec<&String> = binaries.difference(&tests).collect();
    assert!(
        differ.is_empty(),
        "these libraries are built another way when the tests are built, so they compile twice: {differ:#?}\n(a dev-dependency enables more features of them: enable the same features in the normal dependency, or drop the dev-dependency's features)"
    );
}
