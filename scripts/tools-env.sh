#!/usr/bin/env bash
# make tools-env: build-tools/venv, the validators make test runs over deploy/kubernetes
# (kubernetes-validate, checkov, yamllint), from tests/deploy/requirements.txt (every package
# pinned, installed without resolving) and reused while the pins are unchanged. Needs a
# CPython >= 3.9 with venv ($PYTHON, else python3 on PATH) and the network to PyPI the first
# time.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=build-tools/venv
REQ=tests/deploy/requirements.txt
PYTHON=${PYTHON:-python3}
stamp=$VENV/.kvtier-pins
want=$(sha256sum "$REQ" | cut -d' ' -f1)
if [[ -x $VENV/bin/python && -f $stamp && $(cat "$stamp") == "$want" ]]; then
  exit 0
fi
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$REQ"
echo "$want" >"$stamp"
"$VENV/bin/kubernetes-validate" --version
