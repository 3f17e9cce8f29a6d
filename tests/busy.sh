#!/usr/bin/env bash
# Runs the whole suite (`tests/run.sh`) N times in a row (default 3) beside two CPU-bound
# processes, as issue 25 asks: a legitimate run must pass on a busy machine. Prints each run's
# wall time; stops at the first failure. Usage: bash tests/busy.sh [N] [nextest args...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-3}
shift || true
hogs=()
for _ in 1 2; do
    # `yes` is on every machine; `stress-ng --cpu 2` does the same where it is installed.
    yes >/dev/null &
    hogs+=($!)
done
trap 'kill "${hogs[@]}" 2>/dev/null || true' EXIT
for i in $(seq 1 "$runs"); do
    start=$(date +%s)
    bash "$root/tests/run.sh" "$@"
    echo "busy run $i of $runs passed in $(( $(date +%s) - start )) s beside two CPU hogs"
done
