//! Loading a component: reading, compiling and checking it against the host's contract.

use std::path::{Path, PathBuf};

use thiserror::Error;
use wasmtime::component::types::ComponentItem;
use wasmtime::component::Component;

use crate::bindings::{HANDLER_EXPORT, HOST_INTERFACES};

/// Why a component could not be loaded. Each variant names the file.
#[derive(Debug, Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("component `{path}`: cannot read it: {error}{hint}", hint = read_hint(error))]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error (shown in the message, so not a `source`: it would print twice).
        error: std::io::Error,
    },
    /// The file is neither WebAssembly nor WebAssembly text.
    #[error("component `{path}`: not a WebAssembly file (no `\\0asm` header); build its project with `dedup-host build` (or its language's tool for `wasm32-wasip2`)")]
    NotWasm {
        /// The file.
        path: PathBuf,
    },
    /// The file is a core module, not a component.
    #[error("component `{path}`: is a core WebAssembly module, not a component; build for `wasm32-wasip2`, or wrap it with `wasm-tools component new`")]
    CoreModule {
        /// The file.
        path: PathBuf,
    },
    /// wasmtime refused to compile it.
    #[error("component `{path}`: does not compile: {message}")]
    Compile {
        /// The file.
        path: PathBuf,
        /// wasmtime's explanation.
        message: String,
    },
    /// The component does not export the handler interface.
    #[error("component `{path}`: does not export `{HANDLER_EXPORT}` (it exports {found}); implement the `handler-guest` world (`dedup-host wit` writes it; `dedup-host new` makes a project that does)")]
    MissingExport {
        /// The file.
        path: PathBuf,
        /// What it exports instead, for the message.
        found: String,
    },
    /// The component imports something the host does not provide.
    #[error("component `{path}`: imports `{import}`, which this host does not provide (it provides `dedup:handler` log/config and WASI 0.2)")]
    UnknownImport {
        /// The file.
        path: PathBuf,
        /// The import's name.
        import: String,
    },
    /// The component's imports or exports have the right names but the wrong types.
    #[error(
        "component `{path}`: does not match the host's `dedup:handler@0.1.0` contract: {message}"
    )]
    Link {
        /// The file.
        path: PathBuf,
        /// wasmtime's explanation.
        message: String,
    },
}

/// The magic and version bytes of a core module and of a component.
const CORE_MODULE_VERSION: [u8; 4] = [1, 0, 0, 0];
const WASM_MAGIC: &[u8; 4] = b"\0asm";

/// Compiles `bytes` after checking they hold a component (binary, or text for `.wat` files).
pub(crate) fn compile(
    engine: &wasmtime::Engine,
    path: &Path,
    bytes: &[u8],
) -> Result<Component, LoadError> {
    let is_text = path.extension().is_some_and(|e| e == "wat");
    if bytes.starts_with(WASM_MAGIC) {
        if bytes.get(4..8) == Some(&CORE_MODULE_VERSION[..]) {
            return Err(LoadError::CoreModule {
                path: path.to_path_buf(),
            });
        }
    } else if !is_text {
        return Err(LoadError::NotWasm {
            path: path.to_path_buf(),
        });
    }
    Component::new(engine, bytes).map_err(|e| {
        let message = format!("{e:#}");
        if is_text && message.contains("expected `(`") {
            LoadError::NotWasm {
                path: path.to_path_buf(),
            }
        } else if message.contains("core module") || message.contains("component model feature") {
            LoadError::CoreModule {
                path: path.to_path_buf(),
            }
        } else {
            LoadError::Compile {
                path: path.to_path_buf(),
                message,
            }
        }
    })
}

/// What a component imports beyond the handler contract and WASI's basics.
pub(crate) struct Imports {
    /// `wasi:http` (outbound calls).
    pub(crate) http: bool,
}

/// Checks the component's exports and imports by name, before linking checks their types.
pub(crate) fn check_contract(
    engine: &wasmtime::Engine,
    path: &Path,
    component: &Component,
) -> Result<Imports, LoadError> {
    let ty = component.component_type();
    let mut imports = Imports { http: false };
    for (name, item) in ty.imports(engine) {
        let http = is_wasi_http(name);
        imports.http |= http;
        let known = HOST_INTERFACES.contains(&name) || is_wasi_p2(name) || http;
        if !known || !matches!(item.ty, ComponentItem::ComponentInstance(_)) {
            return Err(LoadError::UnknownImport {
                path: path.to_path_buf(),
                import: name.to_string(),
            });
        }
    }
    let exports: Vec<String> = ty
        .exports(engine)
        .map(|(name, _)| name.to_string())
        .collect();
    if !exports.iter().any(|e| e == HANDLER_EXPORT) {
        let found = if exports.is_empty() {
            "nothing".to_string()
        } else {
            exports
                .iter()
                .map(|e| format!("`{e}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(LoadError::MissingExport {
            path: path.to_path_buf(),
            found,
        });
    }
    Ok(imports)
}

/// `wasi:http/<interface>@0.2.x`: linked for the components that import it, served only on
/// routes that grant outbound HTTP.
fn is_wasi_http(name: &str) -> bool {
    name.strip_prefix("wasi:http/")
        .is_some_and(|interface| interface.contains("@0.2."))
}

/// The WASI 0.2 interfaces (`wasi:<package>/<interface>@0.2.x`) that `wasmtime-wasi` links,
/// which the host links for toolchains
/// whose standard library imports them. Whether a given one is granted anything is decided by
/// the per-invocation `WasiCtx`, which grants nothing by default.
fn is_wasi_p2(name: &str) -> bool {
    const LINKED: &[&str] = &["cli", "clocks", "filesystem", "io", "random", "sockets"];
    let Some(rest) = name.strip_prefix("wasi:") else {
        return false;
    };
    let Some((package, interface)) = rest.split_once('/') else {
        return false;
    };
    LINKED.contains(&package) && interface.contains("@0.2.")
}

/// What to do about a component file that cannot be read: a missing one is usually not
/// built yet.
fn read_hint(error: &std::io::Error) -> &'static str {
    match error.kind() {
        std::io::ErrorKind::NotFound => "; build it with `dedup-host build` in its project",
        _ => "",
    }
}
