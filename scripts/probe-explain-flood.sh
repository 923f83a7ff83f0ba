#!/bin/bash
# Fire-and-forget explains against another tenant's load (issue 54 item 4; docs/benchmarks.md,
# "A shared host"): uid 65534 makes NAMESPACES namespaces (a Hello per model id, a block
# each), then starts KVCTLS `kvctl explain` of 2,000 hashes each, killing each after 0.4 s,
# while root's 2-session kvtier-load runs for 5 s (the same load just before is the
# baseline) and /healthz is probed every 100 ms. Then SIGTERM: how long kvtierd takes to
# exit. Needs root (setpriv) and `make build` (BUILD=dir for another build). Run from the
# repository root.
set -u
B=$(realpath "${BUILD:-build}")
NAMESPACES=${NAMESPACES:-400}
KVCTLS=${KVCTLS:-300}
. "$(dirname "$0")/probe-common.sh"
probe_dirs
cat > $T/d/cfg.yaml <<Y
socket: {path: $T/d/k.sock, group: "65534"}
data_dir: $T/d/var
security: {allow_unknown: true}
metrics: {port: 0}
tiers:
  nvme: {files: [{path: $T/d/slots, capacity: 256MiB}], write_policy: write_through}
Y
(cd $T/d && exec $B/bin/kvtierd --config $T/d/cfg.yaml) > $T/d/log 2>&1 & D=$!
for i in $(seq 100); do $B/bin/kvctl -s $T/d/k.sock status >/dev/null 2>&1 && break; sleep 0.2; done
kill -0 $D || { cat $T/d/log; exit 1; }
url=$(grep -o "metrics at [^ ]*" $T/d/log | head -1 | cut -d' ' -f3)
load() { timeout 60 $B/bin/kvtier-load -s $T/d/k.sock --sessions 2 --seconds 5 --tokens-per-block 1 --json 2>/dev/null | /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["requests"])'; }
cat > $T/py/ns.py <<'P'
import sys, kvtier
sock, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    c = kvtier.Client(kvtier.Layout(f"m-{i}", layers=1, kv_heads=1, head_dim=64, dtype="bf16", tokens_per_block=16),
                      sock, name="ns-maker")
    c.commit(c.allocate(1), [i.to_bytes(16, "big")])
    c.close()
P
PYTHONPATH=$T/py setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 $T/py/ns.py $T/d/k.sock $NAMESPACES || { tail -5 $T/d/log; exit 1; }
hashes=$(/usr/bin/python3 -c 'print(" ".join("%032x" % (i + 7 << 64) for i in range(2000)))')
base=$(load)
(
  for i in $(seq $KVCTLS); do
    setpriv --reuid=65534 --regid=65534 --clear-groups timeout -s KILL 0.4 $B/bin/kvctl -s $T/d/k.sock explain $hashes >/dev/null 2>&1 &
    sleep 0.01
  done
  wait
) &
F=$!
(ok=0; n=0; end=$((SECONDS + 5)); while [ $SECONDS -lt $end ]; do n=$((n + 1)); c=$(curl -s -o /dev/null -m 1 -w '%{http_code}' ${url%/metrics}/healthz); [ "$c" = 200 ] && ok=$((ok + 1)); sleep 0.1; done; echo "$ok of $n") > $T/health &
H=$!
under=$(load)
wait $H 2>/dev/null
wait $F
echo "load requests in 5 s: baseline $base, during $KVCTLS explains $under; /healthz 200 $(cat $T/health)"
curl -s $url | grep -E "^kvtier_explains_" || echo "(no explain job metrics in this build)"
t0=$(date +%s.%N); kill $D; wait $D 2>/dev/null; t1=$(date +%s.%N)
echo "SIGTERM to exit: $(/usr/bin/python3 -c "print(round($t1 - $t0, 2))") s"
rm -rf $T
