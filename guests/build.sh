#!/usr/bin/env bash
# Builds every example guest into guests/out/<name>.wasm (WebAssembly components).
#
# Rust guests use rustup's wasm32-wasip2 target when it is installed. Otherwise (machines where
# rustup cannot download targets) they use Debian's Rust toolchain, its standard-library source
# and LLVM's linker, building std from source; the missing Debian packages are installed first.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out="$here/out"
mkdir -p "$out"
export CARGO_TARGET_DIR="$here/target"

rust_guests=(uppercase ledger flaky hostile)
debian_packages=(rustc-web cargo-web rust-web-src lld-22 wasi-libc)

log() { printf 'guests: %s\n' "$*" >&2; }

have_rustup_target() {
    command -v rustup >/dev/null 2>&1 && rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2
}

install_debian_toolchain() {
    local missing=()
    for p in "${debian_packages[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing Debian packages: ${missing[*]}"
    local sudo=()
    [ "$(id -u)" -ne 0 ] && sudo=(sudo)
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
}

build_rust() {
    cd "$here"
    if have_rustup_target; then
        log "building Rust guests with rustup's wasm32-wasip2 target"
        cargo build --release --target wasm32-wasip2 --quiet
    else
        install_debian_toolchain
        log "building Rust guests with Debian's toolchain (std from source)"
        RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1 \
            PATH="/usr/lib/llvm-22/bin:$PATH" RUSTFLAGS="-L /usr/lib/wasm32-wasi" \
            /usr/bin/cargo build --release --target wasm32-wasip2 --quiet \
            -Zbuild-std=std,panic_abort
    fi
    for g in "${rust_guests[@]}"; do
        cp "$CARGO_TARGET_DIR/wasm32-wasip2/release/$g.wasm" "$out/$g.wasm"
    done
}

build_rust
log "built into $out: $(cd "$out" && ls *.wasm | tr '\n' ' ')"
