#!/bin/bash
# Two tenants trading host segments (issue 54 item 3; docs/benchmarks.md, "A shared host"):
# kvtierd in a memory cgroup of its own with a 512 MiB pool of four 128 MiB segments; root
# and uid 65534 each lease one to three segments' worth of pages (again a moment later when
# the other holds too many), write a byte per 4 KiB, release them, for DURATION seconds, so segments change tenant over and over;
# a process of uid 65534 that leased once sleeps with its mapping meanwhile; another root
# session pings. Prints the renewals, the cgroup's memory (most and last, against the
# pool), each tenant's Allocate latency and the pings'. Needs root (cgroups, setpriv) and
# `make build` (BUILD=dir for another build). Run from the repository root.
set -u
B=$(realpath "${BUILD:-build}")
DURATION=${DURATION:-20}
. "$(dirname "$0")/probe-common.sh"
probe_dirs
memory_cgroup kvtier-probe
cat > $T/d/cfg.yaml <<Y
socket: {path: $T/d/k.sock, group: "65534"}
data_dir: $T/d/var
security: {allow_unknown: true, max_leased_share: 0.75}
metrics: {port: 0}
tiers:
  host: {capacity: 512MiB, segment_bytes: 128MiB, page_bytes: 1MiB, huge_pages: "off"}
Y
(echo $BASHPID > $CG/cgroup.procs; cd $T/d && exec $B/bin/kvtierd --config $T/d/cfg.yaml) > $T/d/log 2>&1 & D=$!
for i in $(seq 100); do $B/bin/kvctl -s $T/d/k.sock status >/dev/null 2>&1 && break; sleep 0.2; done
kill -0 $D || { cat $T/d/log; exit 1; }
url=$(grep -o "metrics at [^ ]*" $T/d/log | head -1 | cut -d' ' -f3)
cat > $T/py/churn.py <<'P'
import json, random, sys, time, kvtier
sock, role, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
layout = kvtier.Layout("churn", layers=1, kv_heads=1, head_dim=64, dtype="bf16", tokens_per_block=16)
c = kvtier.Client(layout, sock, name=role)
lat, refused, end, rng = [], 0, time.monotonic() + seconds, random.Random(role)
if role == "sleeper":  # leases once, keeps its mapping, never sends again
    c.release(c.allocate(8))
    time.sleep(seconds)
    sys.exit(0)
while time.monotonic() < end:
    t0 = time.perf_counter()
    if role == "pinger":
        c.ping()
    else:
        try:
            pages = c.allocate(128 * rng.choice((1, 2, 3)))
        except kvtier.ResourceExhaustedError:  # the other tenant holds the rest: again
            refused += 1
            time.sleep(0.002)
            continue
    lat.append(time.perf_counter() - t0)
    if role == "pinger":
        time.sleep(0.005)
        continue
    for p in pages:
        v = memoryview(c.page(p))
        for off in range(0, len(v), 4096):
            v[off] = 1
    c.release(pages)
lat.sort()
q = lambda f: round(lat[min(len(lat) - 1, int(f * len(lat)))] * 1e3, 1)
print(json.dumps({"role": role, "n": len(lat), "refused": refused, "p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": round(lat[-1] * 1e3, 1)}))
P
as_nobody="setpriv --reuid=65534 --regid=65534 --clear-groups"
before=$(cat $CG/$USAGE)
PYTHONPATH=$T/py $as_nobody /usr/bin/python3 $T/py/churn.py $T/d/k.sock sleeper $((DURATION + 2)) > $T/sleeper & P=$!
sleep 0.5
PYTHONPATH=$T/py /usr/bin/python3 $T/py/churn.py $T/d/k.sock tenant-root $DURATION > $T/root & P="$P $!"
PYTHONPATH=$T/py $as_nobody /usr/bin/python3 $T/py/churn.py $T/d/k.sock tenant-65534 $DURATION > $T/nobody & P="$P $!"
PYTHONPATH=$T/py /usr/bin/python3 $T/py/churn.py $T/d/k.sock pinger $DURATION > $T/pinger & P="$P $!"
most=$before
for i in $(seq $((DURATION * 10))); do
  u=$(cat $CG/$USAGE); [ $u -gt $most ] && most=$u
  sleep 0.1
done
wait $P
last=$(cat $CG/$USAGE)
mib() { echo $(($1 >> 20)); }
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
curl -s $url | grep -E '^kvtier_segment_renewals_total' || echo "(no renewal metric in this build)"
echo "kvtierd's cgroup: $(mib $before) MiB at start (pool 512 MiB), at most $(mib $most) MiB, at the end $(mib $last) MiB"
cat $T/root $T/nobody $T/pinger
kill $D; wait $D 2>/dev/null
rmdir $CG 2>/dev/null || { sleep 1; rmdir $CG; }
rm -rf $T
