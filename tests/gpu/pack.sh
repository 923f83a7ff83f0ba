#!/usr/bin/env bash
# Packs what tests/gpu/device.sh runs on a GPU machine that has CUDA but none of kvtier's
# Debian libraries: this build's programs (stripped) and the test binary, fio, redis-server
# and redis-benchmark, with every shared library they load but the C/C++ runtime, in one
# compressed archive, .devcarry/carry.tar.xz (the device tool's carry is 64 MiB a call).
# Run from the repository root after `make build`.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD:-build}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" .devcarry
programs=("$build/bin/kvtierd" "$build/bin/kvctl" "$build/bin/kvtier-bench" "$build/bin/kvtier-gpu-check"
  "$build/tests/integration_test" "$build/tests/kernels_test" "$(command -v fio)" "$(command -v redis-server)" "$(command -v redis-benchmark)")
for p in "${programs[@]}"; do strip -o "$stage/bin/$(basename "$p")" "$p"; done
# The runtime the device's own libc and libstdc++ provide (newer there) stays behind.
runtime='^(linux-vdso|ld-linux|libc|libm|libpthread|libdl|librt|libresolv|libstdc\+\+|libgcc_s)\.so'
for p in "${programs[@]}"; do
  ldd "$p" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    [[ $name =~ $runtime ]] || cp -Ln "$path" "$stage/lib/$name"
  done
done
# xz: Python's tarfile unpacks it on a machine without an xz program.
tar -C "$stage" -cf - bin lib | xz -9 -T0 >.devcarry/carry.tar.xz
ls -la .devcarry/carry.tar.xz
