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
# The book, warnings as errors: mdBook logs a warning and carries on (an include it cannot
# find, ...). Internal links and anchors are checked by the `book` test.
book_log=$(mdbook build --dest-dir "$root/target/book" "$root/docs" 2>&1) \
    || { echo "$book_log" >&2; echo "tests/run.sh: mdbook build docs failed (above)" >&2; exit 1; }
if grep -E '\b(WARN|ERROR)\b' <<<"$book_log" >&2; then
    echo "tests/run.sh: mdbook build docs warned (above): fix the page it names" >&2
    exit 1
fi
# deploy/: every Kubernetes overlay renders and validates, the systemd unit verifies (each
# skipped with a message when its tool is missing; where kubectl and systemd-analyze are
# installed, as on CI, strictly: then a tool gone missing fails instead).
if command -v kubectl >/dev/null 2>&1 && command -v systemd-analyze >/dev/null 2>&1; then
    export DEDUP_DEPLOY_CHECK_STRICT="${DEDUP_DEPLOY_CHECK_STRICT:-1}"
fi
bash "$root/tests/deploy_check.sh"
# Instruction counts under callgrind: fails when one rose more than 5 % over the baseline.
bash "$root/tests/instructions.sh"
if command -v cargo-nextest >/dev/null 2>&1; then
    cargo nextest run --release --workspace --no-fail-fast "$@"
else
    cargo test --release --workspace --no-fail-fast "$@"
fi
