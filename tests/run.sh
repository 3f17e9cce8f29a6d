#!/usr/bin/env bash
# The test command: installs what is missing, builds the guests and the host, runs every test
# (each test starts its own nats-server on a free port).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
source "$root/tests/setup.sh"
# The vendored crates (wasmtime, async-nats) are the published crates plus documented patches.
bash "$root/host/vendor/check.sh"

cargo build --release --workspace --bins
# Instruction counts under callgrind: fails when one rose more than 5 % over the baseline.
bash "$root/tests/instructions.sh"
if command -v cargo-nextest >/dev/null 2>&1; then
    cargo nextest run --release --workspace --no-fail-fast "$@"
else
    cargo test --release --workspace --no-fail-fast "$@"
fi
