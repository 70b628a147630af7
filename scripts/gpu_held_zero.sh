#!/usr/bin/env bash
# One device call: the plain engine beside the adaptive engine held at k = 0 (scripts/held_zero_ab.py),
# per batch size and per source tree, each in its own process, so a host-work change is an A/B of
# two trees in one call. Trees: "name=path" pairs (a path holds a copy of the repository's
# top-level folders: specserve/, engine/, kernels/, bench/, server/, scripts/).
#   HELD_TREES="base=ab/base new=." HELD_BATCHES="64 256" HELD_ARGS="--rounds 3" bash scripts/gpu_held_zero.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
OUT="$OUT" bash scripts/gpu_run.sh none > /dev/null 2>&1     # installs the wheels, writes $OUT/env.txt
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
for batch in ${HELD_BATCHES:-64}; do
  for tree in ${HELD_TREES:-new=.}; do
    name="${tree%%=*}"; path="${tree#*=}"
    echo "== tree $name ($path), batch $batch" | tee -a "$OUT/held_zero.log"
    t0=$(date +%s)
    ( cd "$path" && PYTHONPATH="/tmp/site:$PWD" timeout "${HELD_TIMEOUT:-240}" python3 scripts/held_zero_ab.py \
        --batch "$batch" --engines "${HELD_ENGINES:-plain,mid}" ${HELD_ARGS:---rounds 3 --steps 200} ) 2>&1 \
      | grep -v "tokenizer you are loading" | tee -a "$OUT/held_zero.log"
    echo "== process wall: $(( $(date +%s) - t0 ))s" | tee -a "$OUT/held_zero.log"
  done
done
