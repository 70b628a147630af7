#!/usr/bin/env bash
# One device call: PDL's row rule for large models (kernels/triton_pdl.LARGE_MODEL_ROWS).
# The GPU test of PDL (bit-equal forwards over graph replays, an 8B-like model at 4 rows among
# them); the 1-token forward A/B per row count for the Llama-3-8B-like shape (rule off vs the
# default; the Qwen3-8B-like one ran on 2026-12-07); and the engine A/B
# (scripts/pdl_rows_engine_ab.py): plain decode at batch 4 and the 8B + 0.6B pair at batch 1,
# with the rule off and on in one process. Bounded to fit one 600 s call.
# Usage: bash scripts/gpu_pdl_rows.sh   (PDL_ENGINE_CONFIGS, default plain:4,pair4:1,pair3:1)
set -o pipefail
bash scripts/gpu_run.sh none > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
echo "== tests/gpu/test_pdl_gpu.py"
timeout 150 python3 -m pytest -m gpu tests/gpu/test_pdl_gpu.py -q --tb=short -p no:cacheprovider 2>&1 \
  | tail -8 | tee "$OUT/pdl_gpu_tests.log"
echo "== forward A/B, LLAMA3_8B_LIKE"
timeout 120 python3 scripts/fused_layer_ab.py --switch pdl --shape LLAMA3_8B_LIKE --rows 1,2,4,8,16 \
  --rounds 3 --out "$OUT/forward_LLAMA3_8B_LIKE" 2>&1 | grep -v "^ \|Triton kernel variant" | tail -9
echo "== engine A/B"
timeout 270 python3 scripts/pdl_rows_engine_ab.py --configs "${PDL_ENGINE_CONFIGS:-plain:4,pair4:1,pair3:1}" \
  --steps 100 --rounds 4 2>&1 | grep -v "Triton kernel variant" | tee "$OUT/engine_ab.log" | tail -30
