#!/usr/bin/env bash
# make engines-env: the engines environment, build-engines/venv, for the real-engine tests
# (make test-engines) and the serving e2e. Created from tests/engines/requirements.txt (every
# package pinned, installed without resolving: see the file) and reused while the pins are
# unchanged; kvtier is (re)installed from ./python each time, built for the venv's Python.
# Needs a CPython >= 3.10 with venv ($PYTHON, else python3 on PATH) and the network to PyPI
# the first time.
#
# --lmcache: also LMCache (tests/engines/requirements-lmcache.txt) into build-engines/lmcache,
# for the side-by-side run `python -m kvtier_testing.vllm_e2e --connector lmcache`.
#
# $VLLM=0.33: the vLLM 0.33 environment instead, build-engines/venv-0.33 from
# tests/engines/requirements-vllm-0.33.txt (PyPI's CUDA build: its scheduler- and worker-level
# classes run here; `make test-engines VLLM=0.33`).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=build-engines/venv
REQ=tests/engines/requirements.txt
if [[ -n ${VLLM:-} ]]; then
  VENV=build-engines/venv-$VLLM
  REQ=tests/engines/requirements-vllm-$VLLM.txt
  [[ -f $REQ ]] || { echo "engines-env: no $REQ (vLLM versions: 0.32 by default, 0.33)" >&2; exit 2; }
fi
source scripts/pinned-venv.sh
pinned_venv "$VENV" "$REQ" 10
# kvtier from this checkout (no build isolation: scikit-build-core and pybind11 are pinned
# above), and kvtier_testing from tests/python by a path file.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation ./python
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$PWD/tests/python" >"$site/kvtier_testing.pth"
"$VENV/bin/python" -c 'import vllm, kvtier.vllm; print("engines-env: vllm", vllm.__version__, "kvtier", kvtier.__file__)' 2>&1 |
  tail -n 1

if [[ ${1:-} == --lmcache ]]; then
  LMC=build-engines/lmcache
  LREQ=tests/engines/requirements-lmcache.txt
  lwant=$(sha256sum "$LREQ" | cut -d' ' -f1)
  if [[ ! -f $LMC/.kvtier-pins || $(cat "$LMC/.kvtier-pins") != "$lwant" ]]; then
    rm -rf "$LMC"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --target "$LMC" -r "$LREQ"
    echo "$lwant" >"$LMC/.kvtier-pins"
  fi
  PYTHONPATH=$LMC LMCACHE_DISABLE_BANNER=1 "$VENV/bin/python" -c 'import lmcache; print("engines-env: lmcache", lmcache.__version__)' 2>&1 | tail -n 1
fi
