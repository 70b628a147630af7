#!/usr/bin/env bash
# One device call: the sampler's cold compile in one process vs in workers (scripts/cold_compile_ab.py),
# then the load ramp alone (scripts/ramp_ab.py) on a fresh Triton cache, so its engines' start-ups
# show the workers at the bench's own configuration (k_max 8, 256 sequences).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
OUT="$OUT" bash scripts/gpu_run.sh none > /dev/null 2>&1     # installs the wheels, writes $OUT/env.txt
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
{
  for mode in ${COLD_MODES:-serial workers}; do
    timeout 240 python3 scripts/cold_compile_ab.py --mode "$mode" --max-reqs "${COLD_REQS:-64}" \
      --max-drafts "${COLD_K:-4}" --workers "${COLD_WORKERS:-8}"
  done
} 2>&1 | tee "$OUT/cold_compile.log"
export TRITON_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
timeout "${RAMP_TIMEOUT:-380}" python3 scripts/ramp_ab.py --rounds "${RAMP_ROUNDS:-5}" \
  --configs "${RAMP_CONFIGS:-plain,adaptive,adaptive:held-zero,k1,k2}" --out "$OUT" 2>&1 \
  | grep -v "tokenizer you are loading" | tee "$OUT/ramp_ab.log"
echo "ramp script wall: $(( $(date +%s) - t0 ))s" | tee -a "$OUT/ramp_ab.log"
