#!/usr/bin/env bash
# One device call: which kernel families of an 8B-like model gain from PDL at decode batch sizes.
# Each run is scripts/fused_layer_ab.py --switch pdl --pdl-families F: the model's 1-token forward
# as CUDA graphs with PDL off and with it on for the families F only (the row rule off:
# --pdl-rows none), alternated in one process.
# Usage: bash scripts/gpu_pdl_families.sh [SHAPE ...]   (default: QWEN3_8B_LIKE LLAMA3_8B_LIKE)
#   PDL_FAMILY_SETS (default "gemv,attention,norm,prologue attention,norm,prologue gemv"),
#   PDL_ROWS (default 1,4), PDL_AB_TIMEOUT seconds per run (default 150)
bash scripts/gpu_run.sh none > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/out}"
for shape in ${*:-QWEN3_8B_LIKE LLAMA3_8B_LIKE}; do
  for families in ${PDL_FAMILY_SETS:-gemv,attention,norm,prologue attention,norm,prologue gemv}; do
    echo "== $shape, PDL for: $families"
    timeout "${PDL_AB_TIMEOUT:-150}" python3 scripts/fused_layer_ab.py --switch pdl --shape "$shape" \
      --pdl-families "$families" --pdl-rows none --rows "${PDL_ROWS:-1,4}" --rounds 3 --out "$OUT/${shape}_${families//,/-}" 2>&1 \
      | grep -v "^ \|Triton kernel variant" | tail -7
  done
done
