#!/usr/bin/env bash
# Checks that each vendored crate, host/vendor/CRATE, is the crates.io crate of the same version
# plus host/vendor/CRATE.patch, byte for byte, the crate's SHA-256 pinned in host/vendor/checksums
# (README.md here says why each patch exists).
#
#   bash host/vendor/check.sh                           check every vendored crate (run by
#                                                       tests/run.sh, so by CI)
#   bash host/vendor/check.sh upgrade wasmtime 48.0.9   vendor another version of one crate
#                                                       with the same patch
#
# The crate is fetched with cargo (so a registry mirror configured for cargo is used too).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
crates=(wasmtime async-nats)
mode=${1:-check}

# Prints the path of crate $1's published .crate of version $2, fetching it with cargo.
fetch_crate() {
    local name=$1 version=$2 project
    project=$(mktemp -d)
    mkdir -p "$project/src"
    touch "$project/src/lib.rs"
    printf '[package]\nname = "vendor-check"\nversion = "0.0.0"\nedition = "2021"\n[dependencies]\n%s = { version = "=%s", default-features = false }\n[workspace]\n' \
        "$name" "$version" >"$project/Cargo.toml"
    # The workspace's lock keeps the crate's dependencies at the versions already downloaded.
    cp "$here/../../Cargo.lock" "$project/Cargo.lock"
    cargo fetch --quiet --manifest-path "$project/Cargo.toml" >&2
    rm -rf "$project"
    local found
    found=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/cache/*/"$name-$version.crate" 2>/dev/null | head -n 1)
    [ -n "$found" ] || { echo "vendor: cargo fetched $name $version but its .crate is not in the registry cache" >&2; exit 1; }
    echo "$found"
}

# Fails unless the .crate at $1 has the SHA-256 that host/vendor/checksums pins for $2 (crates.io's
# own checksum, as Cargo.lock records it for a crate that is not patched).
verify() {
    local crate=$1 file=$2 want have
    want=$(awk -v f="$file" '$2 == f { print $1 }' "$here/checksums")
    have=$(sha256sum "$crate" | cut -d' ' -f1)
    [ -n "$want" ] || { echo "vendor: host/vendor/checksums pins no checksum for $file: add \"$have  $file\" once you have checked it against crates.io" >&2; exit 1; }
    [ "$want" = "$have" ] || { echo "vendor: $file has SHA-256 $have, but host/vendor/checksums pins $want: the registry served another crate" >&2; exit 1; }
}

# Unpacks the published crate $1 of version $2 into $3/upstream, checked against its pinned
# checksum (an upgrade pins the new version's, read from the registry cargo verified it with).
unpack() {
    local crate
    crate=$(fetch_crate "$1" "$2")
    if [ "$mode" = upgrade ] && ! grep -q " $1-$2.crate\$" "$here/checksums"; then
        echo "$(sha256sum "$crate" | cut -d' ' -f1)  $1-$2.crate" >>"$here/checksums"
    fi
    verify "$crate" "$1-$2.crate"
    tar xzf "$crate" -C "$3"
    mv "$3/$1-$2" "$3/upstream"
}

# Checks host/vendor/$1 against the published crate plus host/vendor/$1.patch.
check() {
    local name=$1 vendored="$here/$1" patch_file="$here/$1.patch" work version
    work=$(mktemp -d)
    version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$vendored/Cargo.toml" | head -n 1)
    unpack "$name" "$version" "$work"
    cp -r "$vendored" "$work/vendored"
    (cd "$work" && git diff --no-index --no-prefix upstream vendored >"$work/actual.patch") || true
    if ! cmp -s "$work/actual.patch" "$patch_file"; then
        echo "vendor: host/vendor/$name differs from $name $version on crates.io by more than host/vendor/$name.patch:" >&2
        diff -u "$patch_file" "$work/actual.patch" | sed -n '1,60p' >&2 || true
        echo "vendor: undo the change, or re-vendor with: bash host/vendor/check.sh upgrade $name $version (and explain the new patch in host/vendor/README.md)" >&2
        rm -rf "$work"
        exit 1
    fi
    rm -rf "$work"
    echo "vendor: host/vendor/$name is $name $version from crates.io plus host/vendor/$name.patch" >&2
}

# Re-vendors host/vendor/$1 as version $2 of the published crate plus host/vendor/$1.patch.
upgrade() {
    local name=$1 version=$2 vendored="$here/$1" patch_file="$here/$1.patch" work
    work=$(mktemp -d)
    unpack "$name" "$version" "$work"
    cp -r "$work/upstream" "$work/vendored"
    (cd "$work/vendored" && git apply -p1 "$patch_file") || {
        echo "vendor: host/vendor/$name.patch does not apply to $name $version; apply it by hand in $vendored" >&2
        rm -rf "$work"
        exit 1
    }
    (cd "$work" && git diff --no-index --no-prefix upstream vendored >"$patch_file") || true
    rm -rf "$vendored"
    mv "$work/vendored" "$vendored"
    rm -rf "$work"
    echo "vendor: host/vendor/$name is now $name $version plus the patch; set the version in the workspace Cargo.toml, then build" >&2
}

usage() {
    echo "usage: bash host/vendor/check.sh [check | upgrade CRATE VERSION] (CRATE: ${crates[*]})" >&2
    exit 2
}

case "$mode" in
check)
    for name in "${crates[@]}"; do
        check "$name"
    done
    ;;
upgrade)
    [ $# -eq 3 ] || usage
    [[ " ${crates[*]} " == *" $2 "* ]] || usage
    upgrade "$2" "$3"
    ;;
*)
    usage
    ;;
esac
