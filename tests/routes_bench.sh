#!/usr/bin/env bash
# Usage: routes_bench.sh N  -- one dedup-host with N uppercase routes at default settings:
# prints start-to-ready (warm compile cache: the second start), VmSize and VmRSS once ready.
set -euo pipefail
N=$1; ROOT=$(cd "$(dirname "$0")/.." && pwd); BIN=$ROOT/target/release/dedup-host
GUEST=$ROOT/guests/out/uppercase.wasm
D=$(mktemp -d); trap 'kill $NS 2>/dev/null; rm -rf $D' EXIT
nats-server -js -a 127.0.0.1 -p -1 -sd $D/js -l $D/ns.log & NS=$!
for _ in $(seq 100); do grep -q "Listening for client connections on" $D/ns.log 2>/dev/null && break; sleep 0.1; done
PORT=$(grep -o "Listening for client connections on 127.0.0.1:[0-9]*" $D/ns.log | grep -o "[0-9]*$")
MPORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
{
cat <<T
[nats]
urls = ["nats://127.0.0.1:$PORT"]
[host]
metrics_addr = "127.0.0.1:$MPORT"
[components]
cache_dir = "$D/cache"
[source]
stream = "EVENTS"
subjects = ["in.*.*"]
max_ack_pending = 1000
[claims]
bucket = "claims"
[dead_letter]
subject = "dead.letters"
stream = "DEAD"
[[output_streams]]
name = "OUTPUTS"
subjects = ["in.*.*.done"]
duplicate_window = "10m"
T
for i in $(seq 0 $((N-1))); do printf '[[routes]]\nname = "r%d"\nsubject = "in.r%d.*"\ncomponent = "%s"\nallowed_outputs = ["in.r%d.*.done"]\n' $i $i $GUEST $i; done
} > $D/c.toml
for round in cold warm; do
  T0=$(date +%s.%N)
  $BIN run --config $D/c.toml 2>$D/host.$round.log & H=$!
  until curl -sf http://127.0.0.1:$MPORT/readyz >/dev/null; do
    kill -0 $H 2>/dev/null || { tail -5 $D/host.$round.log; exit 1; }; sleep 0.02; done
  T1=$(date +%s.%N)
  sleep 1
  VS=$(grep VmSize /proc/$H/status | awk '{print $2}'); RS=$(grep VmRSS /proc/$H/status | awk '{print $2}')
  printf "routes=%d %s start_to_ready=%.2fs VmSize=%.1fGiB VmRSS=%.0fMB\n" $N $round $(echo "$T1-$T0"|bc) $(echo "$VS/1048576"|bc -l) $(echo "$RS/1024"|bc -l)
  kill -TERM $H; wait $H || true
done
