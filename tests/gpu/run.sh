#!/usr/bin/env bash
# The GPU check, for the device machine (CUDA toolkit, CMake, no Debian -dev libraries):
# builds kvtier-gpu-check from kernels/ and the Status/logging sources with nvcc alone,
# runs it, and leaves its table in $OUT (or build-gpu/) as gpu_results.md and .json.
# Run from the repository root. Exit 0 when every check passes, 77 with no GPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build-gpu}
mkdir -p build-gpu "$out"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$out/nvidia-smi.txt"
srcs="tests/gpu/gpu_check.cc kernels/kv_layout.cc kernels/cpu_kernels.cc kernels/host_device_backend.cc
      kernels/cuda_device_backend.cc kernels/kv_kernels.cu protocol/base/status.cc protocol/base/logging.cc"
set -x
"$NVCC" -O3 -std=c++17 --expt-relaxed-constexpr -I. -gencode arch=compute_90,code=sm_90 \
  -gencode arch=compute_80,code=sm_80 -x cu $srcs -o build-gpu/kvtier-gpu-check -lcudart_static -ldl -lrt -lpthread \
  2>&1 | tail -20
set +x
[[ -x build-gpu/kvtier-gpu-check ]] || { echo "build failed"; exit 1; }
build-gpu/kvtier-gpu-check | tee "$out/gpu_results.md"
rc=${PIPESTATUS[0]}
build-gpu/kvtier-gpu-check --json > "$out/gpu_results.json" 2>/dev/null || true
exit $rc
