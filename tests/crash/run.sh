#!/usr/bin/env bash
# The long crash and fault campaigns (make crash), many more iterations than the short
# versions in `make test`:
#   - kill -9 of kvtierd at random moments during mixed spill/fetch load, both I/O
#     backends: after every restart every index entry verifies, no wrong byte is served
#     and the page accounting balances; and during quantized (int8) spills: after every
#     restart no block is served outside its error bound;
#   - kill -9 of engines at random moments mid-transfer: every page is reclaimed;
#   - I/O faults (EIO, ENOSPC, short, EAGAIN; writes and syncs) at the Nth I/O.
# Usage: tests/crash/run.sh [iterations] (default 200).
set -euo pipefail
cd "$(dirname "$0")/../.."
iterations=${1:-200}
build=${BUILD:-build}
make build BUILD="$build" >/dev/null
export KVTIER_CRASH_ITERATIONS=$iterations
"$build"/tests/integration_test \
  --gtest_filter='IoBackends/NvmeDaemonTest.Kill9DuringSpillsNeverServesWrongBytes/*:Quantization.Kill9*:EngineKill.*'
"$build"/tests/nvme_test --gtest_filter='*Fault*'
echo "crash campaigns: $iterations daemon kills per I/O backend, $iterations engine kills, fault sweep: passed"
