# Sourced by engines-env.sh and tools-env.sh. pinned_venv VENV REQUIREMENTS [MIN_MINOR]:
# (re)creates VENV with $PYTHON (default python3, at least 3.MIN_MINOR) and every package of
# REQUIREMENTS installed without resolving (each one is pinned), unless VENV was made from
# the same REQUIREMENTS already (a stamp of its hash).
pinned_venv() {
  local venv=$1 req=$2 min=${3:-9} python=${PYTHON:-python3}
  local stamp=$venv/.kvtier-pins want
  want=$(sha256sum "$req" | cut -d' ' -f1)
  if [[ -x $venv/bin/python && -f $stamp && $(cat "$stamp") == "$want" ]]; then
    return 0
  fi
  rm -rf "$venv"
  "$python" -c "import sys; sys.exit(sys.version_info < (3, $min))" ||
    { echo "$venv: $python is older than 3.$min" >&2; return 1; }
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$req"
  echo "$want" >"$stamp"
}
