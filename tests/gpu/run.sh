#!/usr/bin/env bash
# The device run: everything kvtier checks and measures on a machine with a GPU, in one
# call of the device tool (docs/benchmarks.md, GPU). Prepare here: `make build` and
# tests/gpu/pack.sh (the programs and their libraries in .devcarry/); then on the device,
# with .devcarry carried: tests/gpu/run.sh. Stages, each bounded in time and skipped once
# the run's budget (RUN_BUDGET_S, default 520 s) is spent:
#   1. kvtier-gpu-check: kernels vs the CPU reference, two-process CUDA IPC, bandwidth
#      ratios (gpu_check.md, gpu_check.json);
#   2. the device backend's cuda tests (kernels_test), and the GPU-tier integration tests
#      with tiers.gpu.backend cuda, on VMM fds and again on legacy cudaIpcMemHandles
#      (KVTIER_CUDA_IPC=legacy), each test in its own process (gpu_tests.txt);
#   3. kvtier-bench kv and demotion on the cuda backend (gpu_bench.json);
#   4. server-class CPU figures: kvtier-bench nvme, soak --seconds 60, rpc, pipeline
#      (cpu_bench.json).
# Results go to $OUT (or build-gpu/); log.txt has every stage's stderr. Exit 0 when every
# stage passed, 77 without a GPU. GPU_BACKEND=host-emulated runs stages 2-4 on a machine
# without one (with a stand-in nvidia-smi on PATH), to try the script itself.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
out=${OUT:-build-gpu}
mkdir -p "$out"
start=$SECONDS
budget=${RUN_BUDGET_S:-520}
log="$out/log.txt"
backend=${GPU_BACKEND:-cuda}
: >"$log"
: >"$out/gpu_tests.txt"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/machine.txt" 2>&1 ||
  { echo "no GPU: $(cat "$out/machine.txt")"; exit 77; }
{
  echo "cpus $(nproc), $(free -g | awk '/Mem:/ {print $2}') GiB, kernel $(uname -r)"
  df -h /tmp | tail -1
} >>"$out/machine.txt"
cat "$out/machine.txt"

# The carried build, unpacked outside the tree (Python's tarfile: no xz program needed).
root=/tmp/kvtier-carry
python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" .devcarry/carry.tar.xz "$root" ||
  { echo "cannot unpack .devcarry/carry.tar.xz (run tests/gpu/pack.sh here first)"; exit 1; }
export LD_LIBRARY_PATH=$root/lib PATH=$root/bin:$PATH KVTIER_BIN_DIR=$root/bin
chmod -R a+rX "$root"  # the multi-user tests run engines as other uids

left() { echo $((budget - (SECONDS - start))); }
# stage NAME SECONDS COMMAND...: runs COMMAND with at most SECONDS (or what is left).
stage() {
  local name=$1 limit=$2
  shift 2
  local l
  l=$(left)
  if ((l < 15)); then
    echo "SKIPPED $name: run budget spent" | tee -a "$log" >&2
    return 1
  fi
  ((limit > l)) && limit=$l
  echo "== $name (limit ${limit}s, $((SECONDS - start))s in)" >>"$log"
  timeout -k 5 "$limit" "$@" 2>>"$log"
  local rc=$?
  ((rc == 0)) || echo "FAILED $name: exit $rc" | tee -a "$log" >&2
  return $rc
}

# 1. Kernels, IPC, bandwidth.
stage gpu-check 180 kvtier-gpu-check --json "$out/gpu_check.json" | tee "$out/gpu_check.md"

# 2. The GPU-tier tests on the cuda backend, on both IPC paths.
tests=(GpuTier.TwoEnginesShareAGpuBlockThroughTheDaemon GpuTier.DemotionFromGpuToHostKeepsTheBytes
  GpuTier.StoreAndLoadHelpersMoveKvBetweenEngineLayoutsAndPages
  GpuTier.ALoadInLayersMovesOnlyTheLayersAskedAndHoldsItsBlocksUntilFinished
  GpuTier.AnEngineKilledWithGpuPagesLeasedGivesThemBack
  MultiUser.ATenantsGpuSegmentsAreNeverMappedByAnotherTenant
  MultiUser.TheSamePromptNeverHitsAcrossTenantsOnAnyTierOrAcrossRestart
  KvctlDrain.MovesGpuBlocksDownToNvmeRefusesGpuLeasesAndARestartKeepsThem)
# The backend's own tests on cuda (its import is in-process: VMM only).
if stage "kernels_test cuda" 60 kernels_test --gtest_filter='*cuda*' >>"$out/gpu_tests.txt"; then
  echo "PASS kernels_test cuda" | tee -a "$out/gpu_tests.txt"
else
  echo "FAIL kernels_test cuda" | tee -a "$out/gpu_tests.txt"
fi
for ipc in vmm legacy; do
  for t in "${tests[@]}"; do
    if (
      export KVTIER_TEST_GPU_BACKEND=$backend KVTIER_CUDA_IPC=$ipc
      stage "$t ($ipc)" 60 integration_test --gtest_filter="$t" >>"$out/gpu_tests.txt"
    ); then
      echo "PASS $t ($ipc)" | tee -a "$out/gpu_tests.txt"
    else
      echo "FAIL $t ($ipc)" | tee -a "$out/gpu_tests.txt"
    fi
  done
done

# 3. and 4. Benchmarks, each one JSON object, gathered into one file per kind.
bench() {  # bench FILE NAME LIMIT ARGS...
  local file=$1 name=$2 limit=$3
  shift 3
  local j
  # A bench that fails still prints its figures (what failed is in them and in log.txt).
  j=$(stage "kvtier-bench $name" "$limit" kvtier-bench "$@" --json)
  [[ -n $j ]] || j=null
  printf '%s"%s": %s' "$([[ -s $file ]] && echo ', ')" "$name" "$j" >>"$file"
}
: >"$out/gpu_bench.part"
bench "$out/gpu_bench.part" kv 90 kv --device "$backend"
bench "$out/gpu_bench.part" demotion 90 demotion --device "$backend"
: >"$out/cpu_bench.part"
bench "$out/cpu_bench.part" rpc 90 rpc --rounds 5
bench "$out/cpu_bench.part" pipeline 120 pipeline
bench "$out/cpu_bench.part" soak 120 soak --seconds 60
bench "$out/cpu_bench.part" nvme 180 nvme
for k in gpu cpu; do
  { echo "{"; cat "$out/${k}_bench.part"; echo "}"; } >"$out/${k}_bench.json"
  rm -f "$out/${k}_bench.part"
done
cat "$out/gpu_bench.json"
echo "run: $((SECONDS - start)) s, $(grep -c ^PASS "$out/gpu_tests.txt") tests passed, $(grep -c ^FAIL "$out/gpu_tests.txt") failed"
! grep -q -e ^FAILED -e ^SKIPPED "$log"
