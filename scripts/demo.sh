#!/usr/bin/env bash
# make demo: kvtierd on its embedded default (socket and data under ./var/, a 1 GiB host
# pool, metrics on 127.0.0.1:9490), a short synthetic engine load against it, then what
# kvctl sees. Run from the repository root; the daemon is stopped at the end.
set -euo pipefail
bin=${1:-build/bin}
cd "$(dirname "$0")/.."

if "$bin/kvctl" status >/dev/null 2>&1; then
  echo "demo: a kvtierd already answers at ./var/kvtierd.sock; stop it first" >&2
  exit 1
fi
mkdir -p var
"$bin/kvtierd" >var/demo-kvtierd.log 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  "$bin/kvctl" status >/dev/null 2>&1 && break
  kill -0 $daemon 2>/dev/null || { echo "demo: kvtierd exited:"; cat var/demo-kvtierd.log; exit 1; }
  sleep 0.1
done

echo "== kvtierd is up on its embedded default (log: var/demo-kvtierd.log)"
echo "== 4 engine sessions, 3 s of shared-prefix traffic (llama3.1-8b bf16, 16-token blocks of 2 MiB)"
"$bin/kvtier-load" --sessions 4 --seconds 3
echo
echo "== kvctl tiers"
"$bin/kvctl" tiers
echo
echo "== kvctl status"
"$bin/kvctl" status
