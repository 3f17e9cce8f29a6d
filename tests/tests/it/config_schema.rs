//! The JSON Schema of `host.toml` (`dedup-host schema`) accepts every config in the
//! repository, flags a misspelt key as an editor would, and is what the binary prints.

use std::path::Path;
use std::process::Command;

use dedup_host_tests::guests::{host_binary, workspace_root};
use dedup_host_tests::schema;

/// The ```toml blocks of a markdown file.
fn toml_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match (&mut current, line.trim_start()) {
            (None, l) if l.starts_with("```toml") => current = Some(String::new()),
            (Some(_), l) if l.starts_with("```") => blocks.extend(current.take()),
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            _ => {}
        }
    }
    blocks
}

/// Every markdown file of the book and the README.
fn markdown_files(root: &Path) -> Vec<std::path::PathBuf> {
    let mut files = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn every_config_in_the_repository_passes_the_schema() {
    let root = workspace_root();
    let demo = std::fs::read_to_string(root.join("host/demo.toml")).unwrap();
    assert_eq!(
        schema::errors(&demo),
        Vec::<String>::new(),
        "host/demo.toml"
    );
    let mut checked = 1;
    for file in markdown_files(&root) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, block) in toml_blocks(&text).iter().enumerate() {
            // Handler manifests and cases files are other formats: only host configs.
            let config_like = [
                "[nats]",
                "[host]",
                "[source]",
                "[claims]",
                "[[routes]]",
                "[[output_streams]]",
                "[routes.",
                "[components]",
                "[telemetry]",
                "[console]",
                "[deployment]",
                "[dead_letter]",
            ]
            .iter()
            .any(|section| block.lines().any(|l| l.trim_start().starts_with(section)));
            if !config_like {
                continue;
            }
            let errors = schema::errors(block);
            assert!(
                errors.is_empty(),
                "{} block {i}: {errors:?}\n{block}",
                file.display()
            );
            checked += 1;
        }
    }
    assert!(checked > 5, "only {checked} configs found");
}

#[test]
fn a_misspelt_key_is_flagged_with_its_name() {
    let demo = std::fs::read_to_string(workspace_root().join("host/demo.toml")).unwrap();
    assert!(
        demo.contains("\nconcurrency = "),
        "host/demo.toml sets concurrency"
    );
    let misspelt = demo.replacen("\nconcurrency = ", "\nconcurency = ", 1);
    let errors = schema::errors(&misspelt);
    assert!(
        errors.iter().any(|e| e.contains("concurency")),
        "the schema does not flag `concurency`: {errors:?}"
    );
    let wrong_type = demo.replacen("\nconcurrency = ", "\nconcurrency = \"many\" #", 1);
    assert!(
        !schema::errors(&wrong_type).is_empty(),
        "a string for a count passes"
    );
}

#[test]
fn dedup_host_schema_prints_the_schema() {
    let out = Command::new(host_binary())
        .arg("schema")
        .output()
        .expect("run dedup-host schema");
    assert!(out.status.success(), "{out:?}");
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(printed, dedup_host::config::schema::schema());
}

#[test]
fn the_schema_takes_the_durations_and_sizes_the_parser_takes() {
    let durations = [
        "30s",
        "500ms",
        "1h 30m",
        "1h30m",
        "1.5s",
        "12M",
        "2 days",
        "0",
        "1µs",
        "5",
        "soon",
        "5 parsecs",
        "1.",
        "-1s",
        "",
        "5S",
    ];
    for text in durations {
        let parser = dedup_host::durations::parse(text).is_ok();
        let schema = schema::errors(&format!("[claims]\nmax_age = \"{text}\"\n")).is_empty();
        assert_eq!(
            schema, parser,
            "duration `{text}`: schema {schema}, parser {parser}"
        );
    }
    let sizes = [
        "64MiB", "64 MiB", "8MB", "512KiB", "1GiB", "1_000", "64mib", "1 k", "64 MB", "lots",
        "64 XB", "", "-1", "1.5MiB",
    ];
    for text in sizes {
        let parser = dedup_host::size::parse(text).is_ok();
        let schema =
            schema::errors(&format!("[host]\nkeep_resident_bytes = \"{text}\"\n")).is_empty();
        assert_eq!(
            schema, parser,
            "size `{text}`: schema {schema}, parser {parser}"
        );
    }
}
