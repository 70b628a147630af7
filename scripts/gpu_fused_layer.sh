#!/usr/bin/env bash
# One device call: the fused decoder layer A/B (scripts/fused_layer_ab.py), its GPU tests, and the
# same tests with the grid barriers taken out (they must fail).
# Usage: bash scripts/gpu_fused_layer.sh [ab] [tests] [broken]   (default: all three)
what="${*:-ab tests broken}"
bash scripts/gpu_run.sh none > /dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
if [[ "$what" == *ab* ]]; then
  timeout 200 python3 scripts/fused_layer_ab.py --out $OUT --rounds 3 2>&1 | grep -v "^ \|Triton kernel variant" | tail -14
fi
if [[ "$what" == *tests* ]]; then
  timeout 150 python3 -m pytest -m gpu tests/gpu/test_fused_layer_gpu.py -q --timeout 60 -p no:cacheprovider 2>&1 | tail -6 | tee $OUT/gpu_test.txt
fi
if [[ "$what" == *broken* ]]; then
  # every top-level barrier of the kernel becomes a barrier of one program only
  rm -rf /tmp/broken && cp -r . /tmp/broken && cd /tmp/broken && sed -i 's/^    _grid_sync(bar_ptr, nprog)$/    tl.debug_barrier()/' kernels/triton_decoder_layer.py
  export PYTHONPATH=/tmp/site:/tmp/broken
  timeout 100 python3 -m pytest -m gpu tests/gpu/test_fused_layer_gpu.py -q --timeout 60 -p no:cacheprovider -k "decode-1 or catch" 2>&1 | tail -4 | tee $OUT/broken_barrier.txt
fi
