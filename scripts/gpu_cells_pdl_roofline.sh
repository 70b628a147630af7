#!/usr/bin/env bash
# One device call, three parts, each bounded: (1) PDL off/on in the Qwen3-8B-like forward at 1-8
# token rows on whichever card this is (scripts/fused_layer_ab.py, every kernel under PDL in the
# 'on' arm); (2) the adaptive bench's truncated-draft cells at batch 64 and 256 (issue 14), five
# rounds with the per-cell untimed run; (3) the bench's roofline section (batch-1 decode against
# its roofline and the compiled peer). Everything lands in $OUT/results.tgz; the two bench reports
# also loose.
# With EXTRAS=h200, parts (1) and (3) run only on an H200 (an H100 repeat of them is not needed).
# CELLS_PAIRS / CELLS_BATCHES / CELLS_KS / CELLS_REPEATS pick part (2)'s grid (defaults: the
# truncated pair at batch 64 and 256, k 1-4 and 8, five rounds).
#   [EXTRAS=h200] [CELLS_PAIRS=self,unrelated CELLS_BATCHES=1,16,64] bash scripts/gpu_cells_pdl_roofline.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
OUT="$OUT" bash scripts/gpu_run.sh none > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/results; rm -rf "$R" /tmp/bench_ad /tmp/bench_rf; mkdir -p "$R"; cp "$OUT/env.txt" "$R/"; cat "$R/env.txt"
extras=1
if [[ "${EXTRAS:-all}" == h200 ]] && ! grep -q H200 "$R/env.txt"; then extras=0; fi
if [[ $extras == 1 ]]; then
  echo "== (1) PDL by rows, Qwen3-8B-like"
  timeout "${PDL_TIMEOUT:-100}" python3 scripts/fused_layer_ab.py --switch pdl --shape QWEN3_8B_LIKE \
    --pdl-max-hidden 8192 --rows 1,2,4,8 --rounds 3 --out "$R/pdl_rows_QWEN3_8B_LIKE" 2>&1 \
    | grep -v "Triton kernel variant" > "$R/pdl_rows.log"; tail -7 "$R/pdl_rows.log"
fi
echo "== (2) adaptive cells"
timeout "${CELLS_TIMEOUT:-300}" python3 -m specserve.bench.cli --out /tmp/bench_ad --sections adaptive \
  --adaptive-pairs "${CELLS_PAIRS:-mid}" --adaptive-batch-sizes "${CELLS_BATCHES:-64,256}" \
  --adaptive-ks "${CELLS_KS:-1,2,3,4,8}" --adaptive-repeats "${CELLS_REPEATS:-5}" 2>&1 \
  | grep -v "Triton kernel variant" > "$R/bench_adaptive.log"
grep "adaptive \(mid\|self\|unrelated\)\|ramp" "$R/bench_adaptive.log" | tail -8
cp /tmp/bench_ad/bench.md "$OUT/bench_adaptive.md" 2>/dev/null; cp -r /tmp/bench_ad "$R/" 2>/dev/null
if [[ $extras == 1 ]]; then
  echo "== (3) roofline"
  timeout "${ROOF_TIMEOUT:-150}" python3 -m specserve.bench.cli --out /tmp/bench_rf --sections roofline --no-plots 2>&1 \
    | grep -v "Triton kernel variant" > "$R/bench_roofline.log"; grep "roofline:.*%\|peer" "$R/bench_roofline.log" | tail -4
  cp /tmp/bench_rf/bench.md "$OUT/bench_roofline.md" 2>/dev/null; cp -r /tmp/bench_rf "$R/" 2>/dev/null
fi
tar czf "$OUT/results.tgz" -C /tmp results
