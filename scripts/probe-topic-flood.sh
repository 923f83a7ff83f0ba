#!/bin/bash
# A tenant's KV event topic flood against another tenant's load (docs/benchmarks.md, "A
# shared host"): uid 65534 attaches sessions with a new routable id each (a topic each),
# committing a block through each (a commit goes to every topic of the namespace), for
# 5 s, while root's 2-session kvtier-load runs; the same load just before is the baseline.
# Needs root (setpriv) and `make build`. Run from the repository root.
set -u
B=$(realpath "${BUILD:-build}")
T=$(mktemp -d); chmod 711 $T; mkdir -p $T/d $T/py; chmod 755 $T/d
cp -r $B/python/kvtier $T/py/; chmod -R a+rX $T/py
cat > $T/d/cfg.yaml <<Y
socket: {path: $T/d/k.sock, group: "65534"}
data_dir: $T/d/var
security: {allow_unknown: true}
events: {enabled: true}
metrics: {port: 0}
Y
(cd $T/d && exec $B/bin/kvtierd --config $T/d/cfg.yaml) > $T/d/log 2>&1 & D=$!
for i in $(seq 50); do $B/bin/kvctl -s $T/d/k.sock status >/dev/null 2>&1 && break; sleep 0.2; done
url=$(grep -o "metrics at [^ ]*" $T/d/log | head -1 | cut -d' ' -f3)
rss() { awk '/VmRSS/ {print $2}' /proc/$D/status; }
load() { timeout 60 $B/bin/kvtier-load -s $T/d/k.sock --sessions 2 --seconds 5 --tokens-per-block 1 --json 2>/dev/null | /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["requests"], round(j["mean_lookup_us"]))'; }
cat > $T/py/hog.py <<'P'
import sys, time, json, kvtier
sock, secs = sys.argv[1], float(sys.argv[2])
end = time.time() + secs; ok = refused = 0; held = []; err = None
i = 0
while time.time() < end:
    try:
        c = kvtier.Client(kvtier.Layout("m", layers=1, kv_heads=1, head_dim=64, dtype="bf16", tokens_per_block=16),
                          sock, name="hog", routable_id=f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}:8000")
        ok += 1; held.append(c)
        p = c.allocate(1)
        c.commit(p, [i.to_bytes(16, "big")], [b""])  # fans out to every topic of the namespace
    except kvtier.Error as e:
        refused += 1; err = err or str(e)[:160]
    i += 1
print(json.dumps({"attempts": i, "attached": ok, "refused": refused, "first_refusal": err}))
P
kill -0 $D || { cat $T/d/log; exit 1; }
r0=$(rss)
base=$(load)
PYTHONPATH=$T/py setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 $T/py/hog.py $T/d/k.sock 5 > $T/hog.json &
H=$!
under=$(load)
wait $H
echo "base:  $base"
echo "under: $under"
echo "hog:   $(cat $T/hog.json)"
echo "rss kB: $r0 -> $(rss)"
curl -s $url | grep -E "^kvtier_events_(topics|dropped|topics_refused)" 
kill $D; wait $D 2>/dev/null; rm -rf $T
