# Two trees side by side: median decode step (ms) at k = 0 and fixed k = 4, batch 1, four
# alternating rounds. OLD: a checkout of the base commit (git worktree add /tmp/oldtree 775e71a).
#   cd /tmp && bash REPO/docs/bench-cpu/2026-12-07-evening/step_ab.sh
here=$(cd "$(dirname "$0")" && pwd); new=$(cd "$here/../../.." && pwd); old=${OLD:-/tmp/oldtree}
for r in 1 2 3 4; do
  for t in old new; do
    d=$new; [ $t = old ] && d=$old
    for k in 0 4; do
      echo -n "$t r$r "; (cd "$d" && PYTHONPATH="$d" "$new/.venv/bin/python" "$here/step_time.py" $k 2>&1 | grep "^k ")
    done
  done
done
