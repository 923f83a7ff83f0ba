#!/usr/bin/env bash
# Runs each libFuzzer target for a set time over the seed corpus (tests/fuzz/corpus/TARGET)
# plus a working corpus it grows in the build directory. Any crash, sanitizer report or
# broken invariant fails the run; the input that did it is left in FUZZ_DIR/artifacts/.
# Usage: scripts/fuzz.sh FUZZ_DIR SECONDS_PER_TARGET [TARGET...]
set -euo pipefail
dir=$1
seconds=$2
shift 2
targets=("$@")
((${#targets[@]})) || targets=(frame dispatcher redis_reply events config)
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$dir/artifacts"
for t in "${targets[@]}"; do
  work="$dir/corpus-$t"
  mkdir -p "$work"
  echo "fuzz: $t for ${seconds}s"
  # -rss_limit_mb: the dispatcher maps a 1 MiB pool per run at most; anything near 2 GiB is a leak.
  "$dir/${t}_fuzzer" -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=2048 \
    -artifact_prefix="$dir/artifacts/$t-" "$work" "$root/tests/fuzz/corpus/$t" 2>"$dir/$t.log" || {
    tail -n 60 "$dir/$t.log" >&2
    echo "fuzz: $t FAILED (input in $dir/artifacts/)" >&2
    exit 1
  }
  grep -E "^stat::number_of_executed_units|^stat::new_units_added|cov:" "$dir/$t.log" | tail -n 3
done
echo "fuzz: ${targets[*]}: ${seconds}s each, no crash"
