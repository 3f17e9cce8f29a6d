#!/usr/bin/env bash
# The author's loop, timed (issue 46): for each language, a handler project from the template is
# built, tested, deployed and served once (the first compile), then edited (its greeting
# changed, in the handler and its cases) and taken through `build`, `test` and `deploy` again
# until a live host's first output carries the new greeting. Prints the seconds each step took.
#
#   bash tests/edit_loop.sh [rust|python|js|c ...]     (default: rust python js)
#
# Needs the release binary (`cargo build --release --workspace --bins`), nats-server and the
# languages' toolchains (`tests/setup.sh` installs them). Starts its own nats-server on a free
# port and removes everything it made.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/target/release/dedup-host
[ -x "$bin" ] || { echo "edit_loop: build first: cargo build --release --workspace --bins" >&2; exit 2; }
langs=("$@")
[ ${#langs[@]} -gt 0 ] || langs=(rust python js)

work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# A nats-server on a port the kernel picks; its log says which.
nats-server -js -a 127.0.0.1 -p -1 -sd "$work/js" -l "$work/nats.log" &
pids+=($!)
port=
for _ in $(seq 100); do
    port=$(sed -n 's/.*Listening for client connections on 127.0.0.1:\([0-9]*\).*/\1/p' "$work/nats.log" 2>/dev/null | head -1 || true)
    [ -n "$port" ] && break
    sleep 0.1
done
[ -n "$port" ] || { echo "edit_loop: nats-server did not start: $(cat "$work/nats.log")" >&2; exit 1; }

now() { date +%s.%N; }
# The seconds of the wasmtime compile a `build` log reports ("compiled `x.wasm` in 9.2s").
compile_secs() {
    awk '/compiled `/ { v = $NF; if (v ~ /ms$/) { sub(/ms$/, "", v); v = v / 1000 } else { sub(/s$/, "", v) }; c = v }
         END { printf "%.1f", c }'
}
# `dedup-host build`, logging its compile; sets $build (seconds) and $compiled (of which compiling).
build() {
    local t log
    t=$(now)
    log=$(RUST_LOG=dedup_host::cli::compile=info "$bin" build 2>&1)
    build=$(since "$t")
    compiled=$(compile_secs <<<"$log")
}
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# Publishes orders until the route's output carries `$1`; prints nothing, returns once seen.
first_output() {
    local want=$1 n=0
    while :; do
        n=$((n + 1))
        local order=$RANDOM$n
        "$bin" publish --config host.toml --subject "loop.$lang.$order" \
            --msg-id "order-$order" --payload "{\"id\": $order}" >/dev/null
        local seen
        seen=$("$bin" tail --config host.toml "loop.$lang.$order.done" --all \
            --count 1 --wait 30s 2>/dev/null || true)
        if grep -q "$want" <<<"$seen"; then
            return 0
        fi
        [ $n -lt 120 ] || {
            echo "edit_loop: no output with $want; the host's log ends:" >&2
            tail -20 "$work/host-$lang.log" >&2
            return 1
        }
    done
}

printf '%-7s | %-44s | %-52s\n' language "first: build (compile), test, deploy, output" "after an edit: build (compile), test, deploy, output = total"
for lang in "${langs[@]}"; do
    cd "$work"
    "$bin" new --lang "$lang" "loop-$lang" >/dev/null
    cd "loop-$lang"
    cat > host.toml <<TOML
[nats]
urls = ["nats://127.0.0.1:$port"]

[source]
stream = "LOOP_$lang"
subjects = ["loop.$lang.*"]

[[output_streams]]
name = "LOOP_DONE_$lang"
subjects = ["loop.$lang.*.done"]

[[routes]]
name = "loop-$lang"
subject = "loop.$lang.*"
key = { subject_token = 2 }
allowed_outputs = ["loop.$lang.*.done"]
TOML
    build; b1="$build ($compiled)"
    t=$(now); "$bin" test >/dev/null; t1=$(since "$t")
    "$bin" setup --config host.toml >/dev/null
    t=$(now); "$bin" deploy --config host.toml --route "loop-$lang" --component "loop-$lang.wasm" >/dev/null 2>&1; d1=$(since "$t")
    t=$(now)
    "$bin" run --config host.toml >"$work/host-$lang.log" 2>&1 &
    host=$!
    pids+=($host)
    first_output '"hello"'
    o1=$(since "$t")

    # The edit: a new greeting, in the handler and in its cases.
    for f in app.py handler.js src/lib.rs handler.c cases.toml; do
        [ -f "$f" ] && sed -i 's/hello/edited/' "$f"
    done
    start=$(now)
    build; b2="$build ($compiled)"
    t=$(now); "$bin" test >/dev/null; t2=$(since "$t")
    t=$(now); "$bin" deploy --config host.toml --route "loop-$lang" --component "loop-$lang.wasm" >/dev/null 2>&1; d2=$(since "$t")
    t=$(now); first_output '"edited"'; o2=$(since "$t")
    total=$(since "$start")
    printf '%-7s | %14s %5s %5s %5s s              | %14s %5s %5s %5s = %5s s\n' "$lang" "$b1" "$t1" "$d1" "$o1" "$b2" "$t2" "$d2" "$o2" "$total"
    kill "$host" 2>/dev/null || true
    wait "$host" 2>/dev/null || true
done
