#!/usr/bin/env bash
# A/B of one server flag under load on the GPU machine: `specserve bench --sections serve` with
# the flag at value A, then B, alternating, REPEATS times (the host is noisy; side by side
# runs cancel most of its drift). Reports land in $OUT/serve-<value>-<run>/; the table rows are
# printed. Run after `bash scripts/gpu_run.sh none` (installs the carried wheels).
#   bash scripts/serve_ab.sh --ragged-graph-tokens 0 1024 [repeats] [extra bench args...]
set -uo pipefail
flag="$1"; a="$2"; b="$3"; repeats="${4:-2}"; shift 4 2>/dev/null || shift $#
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
for run in $(seq 1 "$repeats"); do
  for v in "$a" "$b"; do
    dir="$OUT/serve-$v-$run"
    timeout "${SERVE_AB_TIMEOUT:-240}" python3 -m specserve.bench.cli --out "$dir" --sections serve \
      "$flag" "$v" --no-plots "$@" > "$dir.log" 2>&1
    echo "== $flag $v, run $run (rc $?)"
    grep -E "^\| [0-9]+ \|" "$dir/bench.md" 2>/dev/null | head -5
  done
done
