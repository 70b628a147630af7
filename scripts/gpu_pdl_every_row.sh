#!/usr/bin/env bash
# One device call: PDL on every kernel of the 8B-like forwards at every row count (1-16), against
# off (scripts/fused_layer_ab.py --pdl-max-hidden 8192), on whichever card this is; then the
# bench's roofline and verify sections (batch-1 decode against its roofline and the compiled
# peer; verification and the draft at batch 1) on the checked-out rule.
# Usage: bash scripts/gpu_pdl_every_row.sh   (results under $OUT; SHAPES: the forwards probed)
set -o pipefail
bash scripts/gpu_run.sh none > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
cat "$OUT/env.txt"
for shape in ${SHAPES:-QWEN3_8B_LIKE LLAMA3_8B_LIKE}; do
  echo "== PDL on every kernel at every row count, $shape"
  timeout 130 python3 scripts/fused_layer_ab.py --switch pdl --shape "$shape" --pdl-max-hidden 8192 \
    --rows 1,2,4,8,16 --rounds 3 --out "$OUT/every_row_$shape" 2>&1 | grep -v "^ \|Triton kernel variant" | tail -9
done
echo "== bench roofline, verify"
timeout 280 python3 -m specserve.bench.cli --out /tmp/bench --sections roofline,verify --no-plots 2>&1 \
  | grep -v "Triton kernel variant" > "$OUT/bench.log"
tail -5 "$OUT/bench.log"; cp /tmp/bench/bench.md "$OUT/" 2>/dev/null
