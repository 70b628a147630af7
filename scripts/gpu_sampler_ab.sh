#!/usr/bin/env bash
# One GPU call: the sampler's GPU tests, a same-process-order A/B of the rejection sampler
# (a base tree's kernels against this checkout's, alternating), and the exactness grid's
# probabilistic cells plus the deliberate breakages. Results land in $OUT.
# Usage (device tool, carry .whl and the base tree):  bash scripts/gpu_sampler_ab.sh BASE_DIR
set -uo pipefail
BASE="${1:?base tree (git archive of engine kernels bench specserve server)}"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
bash scripts/gpu_run.sh none > /dev/null 2>&1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
HEAD_PATH="/tmp/site:$PWD"; BASE_PATH="/tmp/site:$PWD/$BASE"
log="$OUT/sampler_ab.log"
{ nvidia-smi --query-gpu=name --format=csv,noheader; git log -1 --format='head %h %s' 2>/dev/null; } | tee "$log"
echo "== tests/gpu/test_sampling_gpu.py" | tee -a "$log"
PYTHONPATH="$HEAD_PATH" timeout 240 python3 -m pytest -m gpu tests/gpu/test_sampling_gpu.py -q \
  --tb=short -rfs -p no:cacheprovider 2>&1 | tail -15 | tee -a "$log"
for run in 1 2; do
  for tree in base head; do
    p="$HEAD_PATH"; [[ $tree == base ]] && p="$BASE_PATH"
    echo "== sweep run $run, $tree" | tee -a "$log"
    PYTHONPATH="$p" timeout 150 python3 -m specserve.bench.rejection_sampler --sweep --budget-s 0 \
      --out "/tmp/rs_${tree}_${run}" 2>&1 | grep -E "^B=|default|legacy" | tee -a "$log"
  done
done
echo "== exactness: probabilistic and greedy-draft cells, breakages" | tee -a "$log"
PYTHONPATH="$HEAD_PATH" EXACTNESS_OUT=/tmp/ex EXACTNESS_ROWS="${EXACTNESS_ROWS:-50000}" \
  timeout "${EXACTNESS_TIMEOUT:-200}" python3 -m pytest -m gpu tests/gpu/test_exactness_gpu.py -q \
  -k "breakage or probabilistic or greedy_draft" --tb=line -rf -p no:cacheprovider 2>&1 \
  | tail -15 | tee -a "$log"
cp /tmp/ex/*.md "$OUT/" 2>/dev/null
tar czf "$OUT/sampler_ab.tgz" -C /tmp $(cd /tmp && ls -d rs_* ex 2>/dev/null)
