#!/bin/bash
# A mixed load for DURATION seconds (default 900) with kvtierd killed (-9) and restarted at
# a third and two thirds of it, as systemd would (issue 54, "Must show"; docs/benchmarks.md,
# "A shared host"). kvtierd runs in a memory cgroup of its own with a 256 MiB host pool of
# 32 MiB segments over a 1 GiB NVMe slot file, protocol.heartbeat_ttl 2 s. Beside it:
#   root: kvtier-load, 2 sessions, every byte it reads verified, ending every 40th storing
#         request's session with its pages leased and writing over them afterwards;
#   uid 65534: kvtier-load, 1 session, another model;
#   uid 65534: expiry: a process leases 4 pages, stops itself (SIGSTOP) past the TTL, is
#         continued, writes its pages and tries to commit them (must be refused);
#   uid 65534: quarantine: a process that lives on opens a session, leases 8 pages and
#         closes it, again every 0.3 s.
# Printed: both loads' figures (corrupt must be 0), the expiry and quarantine rounds, the
# cgroup's memory (most, against the pool, and what it was made of then), kvtierd's
# descriptors at the start and end of each life. Needs root (cgroups, setpriv) and `make build` (BUILD=dir for another build).
# Run from the repository root.
set -u
B=$(realpath "${BUILD:-build}")
DURATION=${DURATION:-900}
. "$(dirname "$0")/probe-common.sh"
probe_dirs
memory_cgroup kvtier-soak
cat > $T/d/cfg.yaml <<Y
socket: {path: $T/d/k.sock, group: "65534"}
data_dir: $T/d/var
security: {allow_unknown: true}
protocol: {heartbeat_ttl: 2s}
metrics: {port: 0}
tiers:
  host: {capacity: 256MiB, segment_bytes: 32MiB, huge_pages: "off"}
  nvme: {files: [{path: $T/d/slots, capacity: 1GiB}]}
Y
D=
lives=()
start_daemon() {
  (echo $BASHPID > $CG/cgroup.procs; cd $T/d && exec $B/bin/kvtierd --config $T/d/cfg.yaml) >> $T/d/log 2>&1 &
  D=$!
  for i in $(seq 150); do $B/bin/kvctl -s $T/d/k.sock status >/dev/null 2>&1 && break; sleep 0.2; done
  kill -0 $D || { tail -20 $T/d/log; exit 1; }
  fds_start=$(ls /proc/$D/fd | wc -l)
}
end_life() { lives+=("descriptors $fds_start -> $(ls /proc/$D/fd | wc -l)"); }
cat > $T/py/patterns.py <<'P'
import os, signal, sys, time, kvtier
sock, role, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
end = time.monotonic() + seconds
layout = kvtier.Layout("soak-" + role, layers=1, kv_heads=1, head_dim=64, dtype="bf16", tokens_per_block=16)
counts = {}
def count(k):
    counts[k] = counts.get(k, 0) + 1
while time.monotonic() < end:
    if role == "quarantine":
        try:
            c = kvtier.Client(layout, sock, name="quarantine")
            c.allocate(8)
            c.close()  # its 8 pages leased: quarantined while this process lives
            count("rounds")
        except kvtier.Error as e:
            count(type(e).__name__)
        time.sleep(0.3)
        continue
    pid = os.fork()
    if pid == 0:
        try:
            c = kvtier.Client(layout, sock, name="expiry")
            pages = c.allocate(4)
        except kvtier.Error:
            os._exit(2)  # no lease (kvtierd restarting)
        try:
            os.kill(os.getpid(), signal.SIGSTOP)  # past the TTL: the session expires
            for p in pages:
                memoryview(c.page(p))[:4096] = b"\x41" * 4096  # the late writes of a stale engine
            c.commit(pages, [os.urandom(16) for _ in pages])
            os._exit(1)  # committed over a session that had expired
        except kvtier.Error:
            os._exit(0)
    _, st = os.waitpid(pid, os.WUNTRACED)
    if os.WIFSTOPPED(st):  # else it ended before stopping (no daemon to lease from)
        time.sleep(3)
        os.kill(pid, signal.SIGCONT)
        _, st = os.waitpid(pid, 0)
    count({0: "refused", 1: "COMMITTED_AFTER_EXPIRY", 2: "no_lease"}.get(os.waitstatus_to_exitcode(st), "child_failed"))
print(role, counts)
P
as_nobody="setpriv --reuid=65534 --regid=65534 --clear-groups"
start_daemon
pool=$((256 << 20))
before=$(cat $CG/$USAGE)
$B/bin/kvtier-load -s $T/d/k.sock --sessions 2 --seconds $DURATION --abandon-every 40 --json > $T/root.json 2> $T/root.err & P=$!
$as_nobody $B/bin/kvtier-load -s $T/d/k.sock --sessions 1 --seconds $DURATION --model qwen2.5-7b --json > $T/nobody.json 2> $T/nobody.err & P="$P $!"
PYTHONPATH=$T/py $as_nobody /usr/bin/python3 $T/py/patterns.py $T/d/k.sock expiry $DURATION > $T/expiry 2>&1 & P="$P $!"
PYTHONPATH=$T/py $as_nobody /usr/bin/python3 $T/py/patterns.py $T/d/k.sock quarantine $DURATION > $T/quarantine 2>&1 & P="$P $!"
most=$before
t0=$SECONDS
kills=0
# The cgroup's charge split as memory.stat has it (v1: rss, cache, shmem; v2: anon, file,
# shmem), and kvtierd's own anonymous memory, at the most.
split() { awk '$1 ~ /^(total_)?(rss|cache|shmem|anon|file)$/ {printf "%s %d MiB, ", $1, $2 / 1048576}' $CG/memory.stat; grep RssAnon /proc/$D/status | awk '{printf "kvtierd RssAnon %d MiB", $2 / 1024}'; }
while [ $((SECONDS - t0)) -lt $DURATION ]; do
  u=$(cat $CG/$USAGE); [ $u -gt $most ] && { most=$u; most_split=$(split); }
  if [ $kills -lt 2 ] && [ $((SECONDS - t0)) -ge $(((kills + 1) * DURATION / 3)) ]; then
    end_life
    kill -9 $D; wait $D 2>/dev/null
    kills=$((kills + 1))
    start_daemon
  fi
  sleep 2
done
wait $P
end_life
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); $DURATION s, kvtierd killed -9 $kills times"
for f in root nobody; do
  /usr/bin/python3 -c "import json,sys; j=json.load(open('$T/$f.json')); print('$f load:', {k: j[k] for k in ('requests','stored','hit_blocks','corrupt','errors','disconnects','reconnects','abandoned_sessions')})"
done
cat $T/expiry $T/quarantine
echo "kvtierd's cgroup: $((before >> 20)) MiB at start, at most $((most >> 20)) MiB (pool $((pool >> 20)) MiB; at most $(((most - pool) >> 20)) MiB besides): ${most_split:-}"
echo "at the end: $(split)"
for l in "${lives[@]}"; do echo "life: $l"; done
grep -c "quarantined host pages back" $T/d/log | sed 's/^/reclaims logged: /'
kill $D; wait $D 2>/dev/null
rmdir $CG 2>/dev/null || { sleep 1; rmdir $CG; }
rm -rf $T
