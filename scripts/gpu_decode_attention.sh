#!/usr/bin/env bash
# One device call for the attention with its prologue inside (kernels/triton_decode_attention.py):
# its GPU tests and the tests of the code it touches, the same test with the new position's
# key/value written by the wrong split (it must fail), and the model-level A/B of the draft-
# and target-shaped 1-token forwards (scripts/fused_layer_ab.py --switch decode-attention).
# Usage (device tool, carry .whl): bash scripts/gpu_decode_attention.sh [tests] [broken] [ab]
what="${*:-tests broken ab}"
bash scripts/gpu_run.sh none > /dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
if [[ "$what" == *tests* ]]; then
  for f in "tests/gpu/test_layers_gpu.py -k bit_equal" tests/gpu/test_engine_gpu.py \
           tests/gpu/test_decode_ahead_gpu.py ${EXTRA_GPU_TESTS:-}; do
    echo "== $f" | tee -a "$OUT/gpu_tests.log"
    timeout 420 python3 -m pytest -m gpu $f -v --timeout 200 -p no:cacheprovider -rfs 2>&1 \
      | grep -E "PASSED|FAILED|ERROR|passed|failed|^E " | head -40 | tee -a "$OUT/gpu_tests.log"
  done
fi
if [[ "$what" == *broken* ]]; then
  # the split that starts the context writes the new position's key/value (not the one holding it)
  rm -rf /tmp/broken && cp -r . /tmp/broken && cd /tmp/broken
  sed -i 's|holds_new = (kv_lo <= seq_len - 1) \& (seq_len - 1 < kv_hi)|holds_new = split == 0|' kernels/triton_decode_attention.py
  grep -c "holds_new = split == 0" kernels/triton_decode_attention.py | sed 's/^/broken lines: /' | tee "$OUT/broken.txt"
  PYTHONPATH=/tmp/site:/tmp/broken timeout 150 python3 -m pytest -m gpu tests/gpu/test_layers_gpu.py -k bit_equal -q --timeout 60 -p no:cacheprovider 2>&1 | tail -4 | tee -a "$OUT/broken.txt"
  cd - > /dev/null
fi
if [[ "$what" == *ab* ]]; then
  timeout 200 python3 scripts/fused_layer_ab.py --switch decode-attention --shape QWEN3_06B_LIKE --rows 1,4,16,64 --rounds 3 --out "$OUT" 2>&1 | grep -v "^ \|Triton kernel variant" | tail -12
  timeout 200 python3 scripts/fused_layer_ab.py --switch decode-attention --shape QWEN3_8B_LIKE --rows 1,4,16 --rounds 3 --out "$OUT" 2>&1 | grep -v "^ \|Triton kernel variant" | tail -10
fi
