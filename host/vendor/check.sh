#!/usr/bin/env bash
# Checks that host/vendor/wasmtime is the crates.io crate of the same version plus
# host/vendor/wasmtime.patch, byte for byte (README.md here says why the patch exists).
#
#   bash host/vendor/check.sh                 check (run by tests/run.sh, so by CI)
#   bash host/vendor/check.sh upgrade 48.0.9  vendor another version with the same patch
#
# The crate is fetched with cargo (so a registry mirror configured for cargo is used too).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
vendored="$here/wasmtime"
patch_file="$here/wasmtime.patch"
mode=${1:-check}

# Prints the path of wasmtime's published .crate of version $1, fetching it with cargo.
fetch_crate() {
    local version=$1 project
    project=$(mktemp -d)
    mkdir -p "$project/src"
    touch "$project/src/lib.rs"
    printf '[package]\nname = "vendor-check"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\nwasmtime = { version = "=%s", default-features = false }\n[workspace]\n' \
        "$version" >"$project/Cargo.toml"
    # The workspace's lock keeps wasmtime's dependencies at the versions already downloaded.
    cp "$here/../../Cargo.lock" "$project/Cargo.lock"
    cargo fetch --quiet --manifest-path "$project/Cargo.toml" >&2
    rm -rf "$project"
    local found
    found=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"wasmtime-$version.crate" 2>/dev/null | head -n 1)
    [ -n "$found" ] || { echo "vendor: cargo fetched wasmtime $version but its .crate is not in the registry cache" >&2; exit 1; }
    echo "$found"
}

# Unpacks the published crate of version $1 into $2/upstream.
unpack() {
    local crate
    crate=$(fetch_crate "$1")
    tar xzf "$crate" -C "$2"
    mv "$2/wasmtime-$1" "$2/upstream"
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

case "$mode" in
check)
    version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$vendored/Cargo.toml" | head -n 1)
    unpack "$version" "$work"
    cp -r "$vendored" "$work/vendored"
    (cd "$work" && git diff --no-index --no-prefix upstream vendored >"$work/actual.patch") || true
    if ! cmp -s "$work/actual.patch" "$patch_file"; then
        echo "vendor: host/vendor/wasmtime differs from wasmtime $version on crates.io by more than host/vendor/wasmtime.patch:" >&2
        diff -u "$patch_file" "$work/actual.patch" | sed -n '1,60p' >&2 || true
        echo "vendor: undo the change, or re-vendor with: bash host/vendor/check.sh upgrade $version (and explain the new patch in host/vendor/README.md)" >&2
        exit 1
    fi
    echo "vendor: host/vendor/wasmtime is wasmtime $version from crates.io plus host/vendor/wasmtime.patch" >&2
    ;;
upgrade)
    version=${2:?usage: bash host/vendor/check.sh upgrade VERSION}
    unpack "$version" "$work"
    cp -r "$work/upstream" "$work/vendored"
    (cd "$work/vendored" && git apply -p1 "$patch_file") || {
        echo "vendor: host/vendor/wasmtime.patch does not apply to wasmtime $version; apply it by hand in $vendored" >&2
        exit 1
    }
    (cd "$work" && git diff --no-index --no-prefix upstream vendored >"$patch_file") || true
    rm -rf "$vendored"
    mv "$work/vendored" "$vendored"
    echo "vendor: host/vendor/wasmtime is now wasmtime $version plus the patch; set the version in the workspace Cargo.toml, then build" >&2
    ;;
*)
    echo "usage: bash host/vendor/check.sh [check | upgrade VERSION]" >&2
    exit 2
    ;;
esac
