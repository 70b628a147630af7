#!/usr/bin/env bash
# One call on the GPU machine: install carried wheels, run the GPU tests, optionally the benchmark.
# Usage (device tool, carry .whl):  bash scripts/gpu_run.sh [tests] [bench] [bench-args...]
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 NCCL_NVLS_ENABLE=0
# uninstalled: specserve/__init__.py finds server/, engine/, kernels/, bench/ beside it
export PYTHONPATH="$PWD"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c 'import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())'; } 2>&1 | tee "$OUT/env.txt"
what="${1:-tests}"; shift || true
if [[ "$what" == *tests* ]]; then
  # one file at a time, each bounded, so a slow file cannot hide the others' results
  for f in ${GPU_TEST_FILES:-tests/gpu/test_engine_gpu.py tests/gpu/test_layers_gpu.py tests/gpu/test_sampling_gpu.py}; do
    echo "== $f" | tee -a "$OUT/gpu_tests.log"
    timeout "${GPU_TEST_TIMEOUT:-400}" python3 -m pytest -m gpu "$f" -v --tb=short -rfs --durations=5 \
      --timeout 300 -p no:cacheprovider 2>&1 | grep -v "^$" | tee -a "$OUT/gpu_tests.log"
  done
fi
if [[ "$what" == *bench* ]]; then
  # the device returns at most 8 files: the report and log loose, everything (JSON, plots) in a tarball
  timeout "${GPU_BENCH_TIMEOUT:-420}" python3 -m specserve.bench.cli --out /tmp/bench "$@" 2>&1 | tee "$OUT/bench.log"
  cp /tmp/bench/bench.md "$OUT/" 2>/dev/null
  tar czf "$OUT/bench.tgz" -C /tmp bench
fi
