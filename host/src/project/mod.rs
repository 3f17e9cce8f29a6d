//! A handler project, as `dedup-host new` lays it out and `dedup-host build` builds it: its
//! manifest (`dedup.toml`), its language, and the component it builds into.

mod sources;
mod templates;
mod toolchain;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use sources::Sources;
pub use templates::create;
pub use toolchain::{build, build_on_stdout, BuildError};

/// The manifest's file name, in the project's root.
pub const MANIFEST: &str = "dedup.toml";

/// A language a handler can be written in, with its standard toolchain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// Rust, built for wasm32-wasip2 with cargo.
    Rust,
    /// Python, built with componentize-py.
    Python,
    /// JavaScript, built with componentize-js.
    Js,
    /// C, built with clang, wasi-libc, wit-bindgen and wasm-tools.
    C,
}

impl Language {
    /// The name the toolchain script and the manifest use.
    pub fn as_str(self) -> &'static str {
        match self {
            Language::Rust => "rust",
            Language::Python => "python",
            Language::Js => "js",
            Language::C => "c",
        }
    }

    /// The name people call it by.
    pub fn title(self) -> &'static str {
        match self {
            Language::Rust => "Rust",
            Language::Python => "Python",
            Language::Js => "JavaScript",
            Language::C => "C",
        }
    }
}

/// What `dedup.toml` says about a project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The handler's name: the component is `<name>.wasm`.
    pub name: String,
    /// The language it is written in.
    pub language: Language,
}

/// Why a project cannot be made or read.
#[derive(Debug, Error)]
pub enum ProjectError {
    /// The directory holds nothing a language can be told from.
    #[error(
        "no handler project in `{0}`: expected {MANIFEST} (written by `dedup-host new`), or one of \
         Cargo.toml, app.py, handler.js or a .c file"
    )]
    NotAProject(PathBuf),
    /// `dedup.toml` is not valid.
    #[error(
        "`{path}`: {message} (expected `name = \"...\"` and `language = \"rust|python|js|c\"`)"
    )]
    BadManifest {
        /// The manifest.
        path: PathBuf,
        /// The TOML error.
        message: String,
    },
    /// The name cannot name a crate, package and component.
    #[error(
        "`{0}` is not a handler name: use 1-64 lower-case letters, digits and `-`, starting with a \
         letter (example: order-greeter)"
    )]
    BadName(String),
    /// `new` would overwrite files.
    #[error("`{0}` already exists and is not empty: choose another NAME or --dir")]
    Exists(PathBuf),
    /// Reading or writing the project failed.
    #[error("`{path}`: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// Checks a handler name given to `new`.
pub fn check_name(name: &str) -> Result<(), ProjectError> {
    let mut chars = name.chars();
    let ok = name.len() <= 64
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(ProjectError::BadName(name.to_string()))
    }
}

/// Reads the project in `dir`: its manifest, or else its language told from its files and
/// its name from the directory's.
pub fn detect(dir: &Path) -> Result<Manifest, ProjectError> {
    let manifest = dir.join(MANIFEST);
    if manifest.is_file() {
        let text = std::fs::read_to_string(&manifest).map_err(|source| ProjectError::Io {
            path: manifest.clone(),
            source,
        })?;
        return toml::from_str(&text).map_err(|e| ProjectError::BadManifest {
            path: manifest,
            message: e.message().to_string(),
        });
    }
    let has = |name: &str| dir.join(name).is_file();
    let has_c = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .any(|e| e.path().extension().is_some_and(|x| x == "c"))
        })
        .unwrap_or(false);
    let language = if has("Cargo.toml") {
        Language::Rust
    } else if has("app.py") {
        Language::Python
    } else if has("handler.js") {
        Language::Js
    } else if has_c {
        Language::C
    } else {
        return Err(ProjectError::NotAProject(dir.to_path_buf()));
    };
    let absolute = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    let name = absolute
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "handler".into());
    Ok(Manifest { name, language })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(check_name("order-greeter2").is_ok());
        for bad in ["", "Order", "2x", "a b", "a_b", "a.b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn the_language_is_told_from_the_files_without_a_manifest() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            detect(dir.path()),
            Err(ProjectError::NotAProject(_))
        ));
        std::fs::write(dir.path().join("app.py"), "").unwrap();
        assert_eq!(detect(dir.path()).unwrap().language, Language::Python);
        std::fs::write(
            dir.path().join(MANIFEST),
            "name = \"x\"\nlanguage = \"c\"\n",
        )
        .unwrap();
        let manifest = detect(dir.path()).unwrap();
        assert_eq!(
            (manifest.name.as_str(), manifest.language),
            ("x", Language::C)
        );
        std::fs::write(
            dir.path().join(MANIFEST),
            "name = \"x\"\nlanguage = \"go\"\n",
        )
        .unwrap();
        let err = detect(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("dedup.toml") && err.contains("rust|python|js|c"),
            "{err}"
        );
    }
}
