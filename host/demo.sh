#!/usr/bin/env bash
# The main job: installs what is missing (nats-server, the guest toolchain), builds the guests
# and the host, then runs the end-to-end demo on a local nats-server the host starts itself.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# The demo's guests are all Rust; `bash tests/run.sh` builds every language.
GUEST_LANGUAGES=rust NEEDS_PROMTOOL=0 NEEDS_BROWSER=0 NEEDS_NETLAB=0 NEEDS_MDBOOK=0 source "$root/tests/setup.sh"
# The same build as `bash tests/run.sh` (whole workspace, one feature resolution): a `-p dedup-host`
# build resolves dependency features differently and compiles wasmtime a second time.
cargo build --release --workspace --bins
exec target/release/dedup-host dev --demo
