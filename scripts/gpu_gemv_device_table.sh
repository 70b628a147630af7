#!/usr/bin/env bash
# One GPU call: tune the GEMV launch shapes for a GPU other than the H100 (whose table is
# kernels/triton_gemv.py's CONFIG_TABLE) and A/B them in the same call.
#   1. python -m specserve.bench.gemv --ms 1 --grid wide (batch-1 decode and the draft's rows)
#   2. profile_gpu (plain 8B-like decode, and the 8B + 0.6B pair at k = 4), batch 1, with the
#      table in the code, then with SPECSERVE_GEMV_TABLE naming the sweep's gemv.json, then the
#      code's table again.
# On an H100 (already tuned) it runs a plain-sampling sweep of the rejection sampler instead
# (plain rows raced in the row pass or in the final race kernel). Results land in $OUT.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
bash scripts/gpu_run.sh none > /dev/null 2>&1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
name="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
echo "$name" | tee "$OUT/device.txt"
if [[ "$name" == *H100* ]]; then
  for run in 1 2; do
    timeout 120 python3 -m specserve.bench.rejection_sampler --sweep --ks 0 \
      --only legacy,narrow,default,no_plain_row_race --budget-s 999 --out "/tmp/lrr_k0_$run" \
      2>&1 | grep -E "^B=" | tee -a "$OUT/last_row_race_h100.log"
  done
  exit 0
fi
timeout "${SWEEP_TIMEOUT:-220}" python3 -m specserve.bench.gemv --out /tmp/gemv --ms 1 --grid wide \
  2>&1 | tail -5 | tee "$OUT/gemv_sweep.log"
cp /tmp/gemv/gemv.md /tmp/gemv/gemv.json "$OUT/" 2>/dev/null
prof() {  # label [env]
  echo "== $1" | tee -a "$OUT/ab.log"
  env ${2:-} timeout 150 python3 -m specserve.bench.profile_gpu --skip self,sampler --steps 20 \
    --out "$OUT/profile_$1.txt" 2>&1 | tail -2
  grep -E "^=====" "$OUT/profile_$1.txt" | tee -a "$OUT/ab.log"
}
prof code_table
[[ -f /tmp/gemv/gemv.json ]] && prof sweep_table "SPECSERVE_GEMV_TABLE=/tmp/gemv/gemv.json"
prof code_table_again
