#!/usr/bin/env bash
# One GPU call for Tuning.last_row_race (the bonus race in the row pass): the sampling GPU
# tests, then the sampler sweep with the bonus race where it was (legacy, last_row_race=-1) and
# in the row pass (default / narrow: plain sampling; last_row_race=8: every call), all in one
# process per run, two runs; plain sampling is k = 0. Results land in $OUT.
# Usage (device tool, carry .whl):  bash scripts/gpu_last_row_race.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
bash scripts/gpu_run.sh none > /dev/null 2>&1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
log="$OUT/last_row_race.log"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$log"
if [[ "${STAGES:-tests sweeps}" == *tests* ]]; then
  echo "== tests/gpu/test_sampling_gpu.py" | tee -a "$log"
  timeout 240 python3 -m pytest -m gpu tests/gpu/test_sampling_gpu.py -q --tb=short -rfs \
    -p no:cacheprovider 2>&1 | tail -15 | tee -a "$log"
fi
if [[ "${STAGES:-tests sweeps}" == *sweeps* ]]; then
  for run in 1 2; do
    echo "== sweep run $run" | tee -a "$log"
    # k = 0: the bonus race where it was (legacy: rows < 128; last_row_race=-1: >= 128) and in
    # the row pass (narrow, default); k >= 3: unchanged (default, narrow) and in the row pass
    timeout 120 python3 -m specserve.bench.rejection_sampler --sweep --ks 0 \
      --only legacy,narrow,default,last_row_race=-1 --budget-s 999 --out "/tmp/lrr_k0_$run" \
      2>&1 | grep -E "^B=" | tee -a "$log"
    timeout 200 python3 -m specserve.bench.rejection_sampler --sweep --ks 3,5,8 \
      --only default,narrow,last_row_race=8,narrow+last_row_race=8 --budget-s 999 \
      --out "/tmp/lrr_k_$run" 2>&1 | grep -E "^B=|sample_draft" | tee -a "$log"
  done
  tar czf "$OUT/lrr.tgz" -C /tmp $(cd /tmp && ls -d lrr_* 2>/dev/null)
fi
