//! The project templates embedded in the binary, one set per language, so `dedup-host new`
//! needs no checkout of this repository. Each project gets the WIT package, a handler that
//! transforms, rejects malformed input and reads its configuration and logs, its build
//! files, `cases.toml`, a README and `dedup.toml`.

use std::path::{Path, PathBuf};

use super::{check_name, Language, Manifest, ProjectError, MANIFEST};

/// The files every language shares.
const CASES: &str = include_str!("../../templates/cases.toml");
const README: &str = include_str!("../../templates/README.md");

/// A language's own files: (path in the project, text).
fn files(language: Language) -> &'static [(&'static str, &'static str)] {
    match language {
        Language::Rust => &[
            (
                "Cargo.toml",
                include_str!("../../templates/rust/Cargo.toml"),
            ),
            (
                "src/lib.rs",
                include_str!("../../templates/rust/src/lib.rs"),
            ),
            (".gitignore", include_str!("../../templates/rust/gitignore")),
        ],
        Language::Python => &[
            ("app.py", include_str!("../../templates/python/app.py")),
            (
                ".gitignore",
                include_str!("../../templates/python/gitignore"),
            ),
        ],
        Language::Js => &[
            ("handler.js", include_str!("../../templates/js/handler.js")),
            (
                "package.json",
                include_str!("../../templates/js/package.json"),
            ),
            // The repository's own JavaScript guests build through the same file.
            ("build.mjs", include_str!("../../../guests/js/build.mjs")),
            (".gitignore", include_str!("../../templates/js/gitignore")),
        ],
        Language::C => &[
            ("handler.c", include_str!("../../templates/c/handler.c")),
            (".gitignore", include_str!("../../templates/c/gitignore")),
        ],
    }
}

/// What the README says about a language: (how it builds, the handler's file, files beyond
/// the common ones).
fn readme_words(language: Language) -> [&'static str; 3] {
    match language {
        Language::Rust => [
            "cargo, target wasm32-wasip2",
            "src/lib.rs",
            ", `Cargo.toml`",
        ],
        Language::Python => ["componentize-py", "app.py", ""],
        Language::Js => [
            "componentize-js, installed by npm from package.json",
            "handler.js",
            ", `package.json` and `build.mjs` (the componentize-js call)",
        ],
        Language::C => [
            "clang + wasi-libc, wit-bindgen c, wasm-tools",
            "handler.c",
            "",
        ],
    }
}

/// Creates the project `name` in `dir` (which must be missing or empty); returns the files
/// written.
pub fn create(dir: &Path, name: &str, language: Language) -> Result<Vec<PathBuf>, ProjectError> {
    check_name(name)?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ProjectError::Io { path, source }
    };
    if dir.exists() && std::fs::read_dir(dir).map_err(io(dir))?.next().is_some() {
        return Err(ProjectError::Exists(dir.to_path_buf()));
    }
    let [build, source, extra] = readme_words(language);
    let fill = |text: &str| {
        text.replace("{{name}}", name)
            .replace("{{language}}", language.title())
            .replace("{{build}}", build)
            .replace("{{source}}", source)
            .replace("{{extra}}", extra)
    };
    let manifest = Manifest {
        name: name.to_string(),
        language,
    };
    let manifest = format!(
        "# Written by `dedup-host new`; `dedup-host build` reads it.\n{}",
        toml::to_string(&manifest).expect("a manifest is TOML")
    );
    let mut written = Vec::new();
    let common = [
        (MANIFEST, manifest.as_str()),
        ("cases.toml", CASES),
        ("README.md", README),
    ];
    for (path, text) in common.iter().chain(files(language)) {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::write(&path, fill(text)).map_err(io(&path))?;
        written.push(path);
    }
    let wit = dir.join("wit");
    written.extend(crate::wit::write(&wit).map_err(io(&wit))?);
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_project_is_filled_in_and_never_written_over() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("greeter");
        for language in [Language::Rust, Language::Python, Language::Js, Language::C] {
            let dir = dir.join(language.as_str());
            let files = create(&dir, "greeter", language).unwrap();
            assert!(files.iter().any(|f| f.ends_with("wit/world.wit")));
            for file in &files {
                let text = std::fs::read_to_string(file).unwrap();
                assert!(
                    !text.contains("{{"),
                    "{} keeps a placeholder",
                    file.display()
                );
            }
            // The local compile cache is not committed.
            let ignored = std::fs::read_to_string(dir.join(".gitignore")).unwrap();
            assert!(
                ignored.lines().any(|l| l == "/.dedup-host/"),
                "{language:?}: {ignored}"
            );
            let manifest = super::super::detect(&dir).unwrap();
            assert_eq!(
                (manifest.name.as_str(), manifest.language),
                ("greeter", language)
            );
            assert!(matches!(
                create(&dir, "greeter", language),
                Err(ProjectError::Exists(_))
            ));
        }
    }
}
