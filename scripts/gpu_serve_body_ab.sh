#!/usr/bin/env bash
# One device call: the serve section with responses in one JSON body (--serve-no-stream), two
# source trees alternating (a tree is a copy of the repository's top-level folders; its server
# runs from it, so an engine or server change is an A/B under the same client), two runs each.
# Tables are printed; reports and logs come back in $OUT/serve_body_ab.tgz.
#   SERVE_TREES="base=ab/base new=." bash scripts/gpu_serve_body_ab.sh
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
OUT="$OUT" bash scripts/gpu_run.sh none > /dev/null 2>&1     # installs the wheels, writes $OUT/env.txt
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
work=$(mktemp -d)
for run in $(seq 1 "${SERVE_RUNS:-2}"); do
  for tree in ${SERVE_TREES:-new=.}; do
    name="${tree%%=*}"; path="${tree#*=}"
    ( cd "$path" && PYTHONPATH="/tmp/site:$PWD" timeout "${SERVE_TIMEOUT:-170}" python3 -m specserve.bench.cli \
        --out "$work/serve-$name-$run" --sections serve --serve-no-stream \
        --serve-concurrency "${SERVE_LEVELS:-64,256}" --serve-requests "${SERVE_REQUESTS:-512}" --no-plots \
        > "$work/serve-$name-$run.log" 2>&1 )
    echo "== $name run $run rc $?"
    grep -E "^\| [0-9]+ \|" "$work/serve-$name-$run/bench.md" | cut -d'|' -f2-5,12-13
  done
done
tar czf "$OUT/serve_body_ab.tgz" -C "$work" .
