#!/usr/bin/env bash
# Instruction counts: runs each `dedup-bench counts BENCH` under valgrind's callgrind, which
# counts the same instructions for the same work however busy the machine is, and compares
# the instructions per unit (an invocation, or a message on the host side) with
# tests/instructions.baseline. Fails when one rose more than 5 %, naming the bench.
#
#   bash tests/instructions.sh                 # check every bench in the baseline
#   bash tests/instructions.sh guard pipeline  # check only these
#   bash tests/instructions.sh --update [...]  # measure and rewrite the baseline lines
#
# A deliberate change of a count updates the baseline in the same commit, with the reason in
# the commit message. Needs valgrind (tests/setup.sh installs it) and the release binaries.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
baseline="$root/tests/instructions.baseline"
bench="${DEDUP_BENCH_BIN:-$root/target/release/dedup-bench}"
# A rise above this many percent fails the step.
allowed=5
# Counts compare only on the CPU they were measured on: wasmtime compiles guests for the CPU's
# features (as valgrind reports them), and libraries pick code paths by them. The baseline names
# its CPU (model and a hash of its flags); on another one the step reports and does not fail.
cpu="$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2 | xargs) / $(grep -m1 '^flags' /proc/cpuinfo | cksum | cut -d' ' -f1)"

update=0
if [ "${1:-}" = "--update" ]; then
    update=1
    shift
fi
command -v valgrind >/dev/null 2>&1 \
    || { echo "instructions: valgrind is not installed: run bash tests/setup.sh (or apt-get install valgrind)" >&2; exit 1; }
[ -x "$bench" ] \
    || { echo "instructions: $bench is missing: run cargo build --release --workspace --bins" >&2; exit 1; }

if [ $# -gt 0 ]; then
    benches=("$@")
else
    mapfile -t benches < <(awk '!/^#/ && NF { print $1 }' "$baseline")
fi

# The summary (instructions) of the dump whose trigger names $2, in dump files $1.*; 0 if none.
dumped() {
    local f
    for f in "$1".*; do
        if grep -q "^desc: Trigger: Client Request: $2\$" "$f"; then
            awk '/^summary:/ { print $2 }' "$f"
            return
        fi
    done
    echo 0
}

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=0
started=$SECONDS
for name in "${benches[@]}"; do
    out="$scratch/$name"
    t=$SECONDS
    # Guests too big to compile under callgrind (`PRECOMPILED` in tests/src/bench/counts.rs):
    # one run outside valgrind leaves the compile-cache entry the measured run loads.
    case "$name" in
        invoke-python | invoke-js)
            "$bench" counts "$name" 1 >"$out.precompile" 2>&1 \
                || { echo "instructions: bench $name failed to precompile:" >&2; tail -20 "$out.precompile" >&2; exit 1; } ;;
    esac
    if ! valgrind --tool=callgrind --callgrind-out-file="$out.cg" "$bench" counts "$name" \
        >"$out.stdout" 2>"$out.stderr"; then
        echo "instructions: bench $name failed under callgrind:" >&2
        tail -20 "$out.stderr" >&2
        exit 1
    fi
    units=$(awk '/^counts: / { print $3 }' "$out.stdout")
    work=$(dumped "$out.cg" work)
    base=$(dumped "$out.cg" base)
    [ -n "$units" ] && [ "$work" != 0 ] \
        || { echo "instructions: bench $name wrote no \`work\` dump (is the binary current?)" >&2; exit 1; }
    per=$(( (work - base) / units ))
    was=$(awk -v b="$name" '$1 == b { print $2 }' "$baseline")
    if [ "$update" = 1 ]; then
        if [ -n "$was" ]; then
            sed -i "s/^$name [0-9]*/$name $per/" "$baseline"
        else
            echo "$name $per" >>"$baseline"
        fi
        printf 'instructions: %-18s %12s per unit (was %s)  %ss\n' "$name" "$per" "${was:--}" $((SECONDS - t))
        continue
    fi
    [ -n "$was" ] \
        || { echo "instructions: bench $name has no baseline: run bash tests/instructions.sh --update $name" >&2; exit 1; }
    change=$(awk -v a="$per" -v b="$was" 'BEGIN { printf "%+.2f", (a - b) * 100 / b }')
    printf 'instructions: %-18s %12s per unit, baseline %12s (%s %%)  %ss\n' "$name" "$per" "$was" "$change" $((SECONDS - t))
    if awk -v a="$per" -v b="$was" -v p="$allowed" 'BEGIN { exit !(a > b * (1 + p / 100)) }'; then
        echo "instructions: FAIL: $name rose ${change} % (more than $allowed %): $was -> $per instructions per unit. If deliberate, run bash tests/instructions.sh --update $name and commit tests/instructions.baseline with the reason." >&2
        failed=1
    fi
done
if [ "$update" = 1 ]; then
    if grep -q '^# cpu: ' "$baseline"; then
        sed -i "s|^# cpu: .*|# cpu: $cpu|" "$baseline"
    else
        sed -i "3a # cpu: $cpu" "$baseline"
    fi
fi
measured_on=$(sed -n 's/^# cpu: //p' "$baseline")
if [ "$failed" = 1 ] && [ "$measured_on" != "$cpu" ]; then
    echo "instructions: the baseline was measured on \`$measured_on\`, this CPU is \`$cpu\`: counts are not comparable across CPUs, so the rise above is reported, not failed. Measure a baseline on this CPU with bash tests/instructions.sh --update" >&2
    failed=0
fi
echo "instructions: ${#benches[@]} benches in $((SECONDS - started)) s"
exit "$failed"
