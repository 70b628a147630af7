#!/usr/bin/env bash
# One GPU call: the sampler's GPU tests, a same-process-order A/B of the rejection sampler
# (a base tree's kernels against this checkout's, alternating), and the exactness grid's
# probabilistic cells plus the deliberate breakages. Results land in $OUT.
# Usage (device tool, carry .whl and the base tree):  bash scripts/gpu_sampler_ab.sh BASE_DIR
# STAGES picks and orders the parts (default "sampling sweeps exactness"; also "engine",
# the engine's and decode-ahead's GPU tests, and "breakages", the breakages alone).
# SWEEP_RUNS (default 2) alternating base/head sweep pairs; SWEEP_ONLY: the sweep's --only list
# (default: its priority-0 candidates, legacy, default and narrow).
set -uo pipefail
BASE="${1:?base tree (git archive of engine kernels bench specserve server)}"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
bash scripts/gpu_run.sh none > /dev/null 2>&1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
HEAD_PATH="/tmp/site:$PWD"
log="$OUT/sampler_ab.log"
{ nvidia-smi --query-gpu=name --format=csv,noheader; git log -1 --format='head %h %s' 2>/dev/null; } | tee "$log"
gpu_tests() {  # file, timeout, extra pytest args
  echo "== $1 ${*:3}" | tee -a "$log"
  PYTHONPATH="$HEAD_PATH" timeout "$2" python3 -m pytest -m gpu "$1" -q --tb=short -rfs \
    -p no:cacheprovider "${@:3}" 2>&1 | tail -15 | tee -a "$log"
}
for stage in ${STAGES:-sampling sweeps exactness}; do
  case "$stage" in
    sampling) gpu_tests tests/gpu/test_sampling_gpu.py 240 ;;
    engine) gpu_tests tests/gpu/test_engine_gpu.py "${ENGINE_TIMEOUT:-330}"
            gpu_tests tests/gpu/test_decode_ahead_gpu.py 120 ;;
    breakages) EXACTNESS_ROWS=50000 gpu_tests tests/gpu/test_exactness_gpu.py 150 -k breakage ;;
    exactness) EXACTNESS_OUT=/tmp/ex EXACTNESS_ROWS="${EXACTNESS_ROWS:-50000}" gpu_tests \
                 tests/gpu/test_exactness_gpu.py "${EXACTNESS_TIMEOUT:-200}" \
                 -k "breakage or probabilistic or greedy_draft"
               cp /tmp/ex/*.md "$OUT/" 2>/dev/null ;;
    sweeps)
      for run in $(seq 1 "${SWEEP_RUNS:-2}"); do
        for tree in base head; do
          d="$PWD"; [[ $tree == base ]] && d="$PWD/$BASE"
          echo "== sweep run $run, $tree" | tee -a "$log"
          # run from inside the tree: `python -m` puts the working directory first on sys.path,
          # ahead of PYTHONPATH (calls 1 and 2 of 2026-11-27 ran this checkout twice that way)
          (cd "$d" && PYTHONPATH="/tmp/site:$d" timeout 150 python3 -m specserve.bench.rejection_sampler \
            --sweep --budget-s 0 ${SWEEP_ONLY:+--only "$SWEEP_ONLY"} --out "/tmp/rs_${tree}_${run}" 2>&1) | grep -E "^B=|default|legacy|narrow" | tee -a "$log"
        done
      done ;;
  esac
done
tar czf "$OUT/sampler_ab.tgz" -C /tmp $(cd /tmp && ls -d rs_* ex 2>/dev/null)
