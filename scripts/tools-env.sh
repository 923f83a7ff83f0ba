#!/usr/bin/env bash
# make tools-env: build-tools/venv, the validators make test runs over deploy/kubernetes
# (kubernetes-validate, checkov, yamllint), from tests/deploy/requirements.txt (every package
# pinned, installed without resolving) and reused while the pins are unchanged. Needs a
# CPython >= 3.9 with venv ($PYTHON, else python3 on PATH) and the network to PyPI the first
# time.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/pinned-venv.sh
pinned_venv build-tools/venv tests/deploy/requirements.txt 9
