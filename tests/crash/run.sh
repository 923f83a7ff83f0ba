#!/usr/bin/env bash
# The long crash campaigns: kill -9 of kvtierd during NVMe spills, many more times than the
# short version in `make test`. Usage: tests/crash/run.sh [iterations] (default 200).
set -euo pipefail
cd "$(dirname "$0")/../.."
iterations=${1:-200}
make build >/dev/null
KVTIER_CRASH_ITERATIONS=$iterations build/tests/integration_test \
  --gtest_filter='IoBackends/NvmeDaemonTest.Kill9DuringSpillsNeverServesWrongBytes/*'
