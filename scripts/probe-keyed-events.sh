#!/bin/bash
# One tenant's keyed commits against kvtierd's memory (issue 54 item 5; docs/benchmarks.md,
# "A shared host"): with events.token_ids on (what Dynamo's indexer needs), uid 65534
# commits blocks with the most extra keys a block may carry (an 8,007-byte entry each) and
# their token ids for SECONDS, while a subscriber in the socket's group connects and never
# reads and the replay socket keeps its ring; then it commits one block whose entry packs
# to 921 KB (what was accepted before). Prints kvtierd's RSS before and after, the hog's
# commits, and the refusal. TOKEN_IDS=false is the baseline: the same load, no keys kept. Needs root (setpriv) and `make build`. Run from the repository root.
set -u
B=$(realpath "${BUILD:-build}")
SECONDS_=${1:-5}
T=$(mktemp -d); chmod 711 $T; mkdir -p $T/d $T/py; chmod 755 $T/d
cp -r $B/python/kvtier $T/py/; chmod -R a+rX $T/py
cat > $T/d/cfg.yaml <<Y
socket: {path: $T/d/k.sock, group: "65534"}
data_dir: $T/d/var
security: {allow_unknown: true}
events: {enabled: true, token_ids: ${TOKEN_IDS:-true}, publish: "ipc://$T/d/pub.sock", replay: "ipc://$T/d/replay.sock"}
metrics: {port: 0}
Y
(cd $T/d && exec $B/bin/kvtierd --config $T/d/cfg.yaml) > $T/d/log 2>&1 & D=$!
for i in $(seq 50); do $B/bin/kvctl -s $T/d/k.sock status >/dev/null 2>&1 && break; sleep 0.2; done
kill -0 $D || { cat $T/d/log; exit 1; }
url=$(grep -o "metrics at [^ ]*" $T/d/log | head -1 | cut -d' ' -f3)
rss() { awk '/VmRSS/ {print $2}' /proc/$D/status; }
cat > $T/py/stalled.py <<'P'
import sys, time, zmq
s = zmq.Context().socket(zmq.SUB)
s.setsockopt(zmq.RCVHWM, 0)  # never a bound on our side: what queues is kvtierd's
s.connect(sys.argv[1]); s.setsockopt(zmq.SUBSCRIBE, b"")
time.sleep(float(sys.argv[2]))  # never reads
P
cat > $T/py/hog.py <<'P'
import sys, time, json, kvtier
sock, secs = sys.argv[1], float(sys.argv[2])
key = b"\xda\x0f\xa0" + b"k" * 4000           # one 4,000-byte key
entry = b"\x92" + key * 2                      # a block's entry: 8,007 bytes packed
layout = kvtier.Layout("m", layers=1, kv_heads=1, head_dim=64, dtype="bf16", tokens_per_block=16)
c = kvtier.Client(layout, sock, name="hog")
end = time.time() + secs; blocks = refused = 0; err = None; i = 0
while time.time() < end:
    p = c.allocate(16)
    hashes = [(i * 16 + j).to_bytes(16, "big") for j in range(16)]
    try:
        r = c.commit(p, hashes, token_ids=list(range(16 * 16)), extra_keys=b"\xdc\x00\x10" + entry * 16)
        blocks += sum(1 for x in r if x.ok)
    except kvtier.Error as e:
        refused += 1; err = err or str(e)[:160]
    i += 1
wide = b"\x91\xdc\x00\x40" + (b"\x94" + (b"\xda\x0e\x10" + b"k" * 3600) * 4) * 64
p = c.allocate(1)
try:
    c.commit(p, [b"w" * 16], extra_keys=wide); old = "accepted"
except kvtier.Error as e:
    old = str(e)[:200]
print(json.dumps({"commits": i, "blocks": blocks, "refused": refused, "first_refusal": err, "921KB_entry": old}))
P
setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 $T/py/stalled.py "ipc://$T/d/pub.sock" $((SECONDS_ + 5)) & S=$!
sleep 0.5
r0=$(rss)
PYTHONPATH=$T/py setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 $T/py/hog.py $T/d/k.sock $SECONDS_ > $T/hog.json
echo "hog:    $(cat $T/hog.json)"
echo "rss kB: $r0 -> $(rss) (after ${SECONDS_} s)"
sleep 1; echo "rss kB: $(rss) (1 s later)"
curl -s $url | grep -E "^kvtier_events_(dropped|published|messages)" | head
kill $S 2>/dev/null; kill $D; wait $D 2>/dev/null; rm -rf $T
