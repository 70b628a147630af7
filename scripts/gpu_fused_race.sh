#!/usr/bin/env bash
# One device call for Tuning.fused_race (the rejection sampler's row pass, final race and
# finalize in one launch): (1) the sampler's GPU tests that compare it, PDL and prefetch with the
# separate launches bit for bit; (2) the sampler sweep, the separate kernels against the fused
# launch (with and without prefetch) in one process, SWEEP_RUNS times; (3) with EXACT=1, the
# exactness grid's probabilistic and greedy-draft cells and the breakages (default tuning).
# TESTS=0 skips (1); SWEEP_B / SWEEP_KS / SWEEP_ONLY / SWEEP_RUNS pick the sweep.
#   bash scripts/gpu_fused_race.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
OUT="$OUT" bash scripts/gpu_run.sh none > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
R=/tmp/results; rm -rf "$R"; mkdir -p "$R"; cp "$OUT/env.txt" "$R/"; cat "$R/env.txt"
if [[ "${TESTS:-1}" != 0 ]]; then
echo "== (1) sampler GPU tests"
timeout "${TESTS_TIMEOUT:-150}" python3 -m pytest -m gpu tests/gpu/test_sampling_gpu.py -q --tb=short -rfs \
  -p no:cacheprovider -k "${TESTS_K:-fused_race or pdl or prefetch}" 2>&1 | tail -15 | tee "$R/gpu_tests.log"
fi
for run in $(seq 1 "${SWEEP_RUNS:-2}"); do
  echo "== (2) sweep run $run"
  (cd /tmp && timeout "${SWEEP_TIMEOUT:-170}" python3 -m specserve.bench.rejection_sampler --sweep --budget-s 0 \
    --only "${SWEEP_ONLY:-default,prefetch,fused,fused+prefetch}" \
    --batch-sizes "${SWEEP_B:-8,64,256}" --ks "${SWEEP_KS:-3,5,8}" --out "$R/sweep$run") 2>&1 \
    | grep -v "Triton kernel variant" | tee "$R/sweep$run.log" | grep "^B=" | sed 's/  same tokens True//'
done
cp "$R/sweep1.md" "$OUT/" 2>/dev/null
if [[ "${EXACT:-0}" == 1 ]]; then
  echo "== (3) exactness grid (probabilistic and greedy-draft cells, breakages) with the default tuning"
  EXACTNESS_OUT=/tmp/ex EXACTNESS_ROWS="${EXACTNESS_ROWS:-30000}" timeout "${EXACT_TIMEOUT:-220}" \
    python3 -m pytest -m gpu tests/gpu/test_exactness_gpu.py -q --tb=short -rfs -p no:cacheprovider \
    -k "breakage or probabilistic or greedy_draft" 2>&1 | tail -8 | tee "$R/exactness.log"
  cp /tmp/ex/*.md "$R/" 2>/dev/null
fi
tar czf "$OUT/results.tgz" -C /tmp results
