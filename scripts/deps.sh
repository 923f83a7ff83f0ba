#!/usr/bin/env bash
# Installs the Debian packages kvtier builds, tests and benchmarks with.
# Idempotent: when every package is present it changes nothing and needs no network.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git python3 curl file
  liburing-dev libboost-dev flatbuffers-compiler libflatbuffers-dev
  librocksdb-dev libyaml-cpp-dev libcli11-dev libxxhash-dev nlohmann-json3-dev
  libsystemd-dev prometheus-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev clang-format
  prometheus fio tmux systemd python3-yaml python3-venv
  python3-dev pybind11-dev python3-numpy python3-pytest python3-torch libopenblas0-pthread
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev python3-zmq python3-msgpack
  redis-server redis-tools libhiredis-dev libsodium-dev
  podman runc catatonit netavark debootstrap
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "deps.sh: installing ${missing[*]}" >&2
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "deps.sh: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
