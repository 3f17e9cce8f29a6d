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
    // Top modules: `pipeline/consume.rs` belongs to `pipeline`, `serve.rs` to `serve`.
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    // Sibling files inside one directory, through `super::`.
    let mut siblings: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, text) in &files {
        let module = rel.split('/').next().unwrap().trim_end_matches(".rs");
        let refs = referenced(text, "crate::");
        top.entry(module.to_string())
            .or_default()
            .extend(refs.into_iter().filter(|m| m != module));
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
    assert_eq!(circles(&top), Vec::<(String, String)>::new(), "top modules");
    assert_eq!(
        circles(&siblings),
        Vec::<(String, String)>::new(),
        "sibling files"
    );
}
