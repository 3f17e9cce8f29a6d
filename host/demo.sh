#!/usr/bin/env bash
# The main job: installs what is missing, builds the guests and the host, then runs the demo.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
source "$root/tests/setup.sh"
cargo build --release -p dedup-host
for args in \
    "--component guests/out/uppercase.wasm --subject orders.new --payload hello" \
    "--component guests/out/ledger.wasm --subject ledger.adjust --payload {\"account\":\"acc-1\",\"amount\":250,\"transaction_id\":\"tx-1\"}" \
    "--component guests/out/ledger.wasm --subject ledger.adjust --payload not-json" \
    "--component guests/out/flaky.wasm --subject jobs.run --payload x --attempt 1 --config succeed_on_attempt=2"; do
    echo "\$ dedup-host invoke $args"
    # shellcheck disable=SC2086
    target/release/dedup-host invoke $args || true
done
