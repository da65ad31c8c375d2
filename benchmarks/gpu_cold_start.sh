#!/usr/bin/env bash
# Issue 20 item 3 on one GPU: seconds each new tree budget costs on a fresh Triton cache (compile, check,
# capture, rounds), then in a second process on the same cache (nothing should compile: the cache's file
# count before and after). bench-engine on the Qwen3-8B shape (random bf16 weights), budgets 16..1024 in
# one process, as a sweep meets them; the per-budget seconds are the gaps between bench-engine's
# "rounds ddtree B" progress lines (the cold/warm mode of gpu_roofline.sh, without its verify curve,
# profile and tests). Then B = 16, 32 once more on another fresh cache with the grid build where the
# rule takes the one-block kernel (builders.AUTO_BLOCK_MAX_BUDGET = 0, patched in this process only):
# what the faster-compiling choice would save there. About 3 min of GPU time. Run from the repo root:
#   OUT=/tmp/out bash benchmarks/gpu_cold_start.sh
# Files under $OUT: session.txt (env, cache file counts, the per-budget table), cold.{json,txt,log},
# warm.{json,txt,log}, grid_small.{json,txt,log} (.log: timestamped progress lines). Knobs:
# COLD_TIMEOUT, WARM_TIMEOUT, ROUNDS, GRID_SMALL=0 (skip the last run), FASTPATH_TESTS=1 (then also
# the fast path's auto-builder GPU test, in its own Triton cache, at the end).
set -u
OUT=${OUT:-/tmp/ddtree-cold}; mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
unset TRITON_CACHE_DIR
export DDTREE_BENCH_CACHE_DIR=/tmp/ddtree-cold-cache; rm -rf "$DDTREE_BENCH_CACHE_DIR"
LOG="$OUT/session.txt"
step() { echo "== $* ($(date -u +%FT%T.%3NZ))" | tee -a "$LOG"; }
stamp() { while IFS= read -r l; do echo "$(date -u +%T.%3N) $l"; done; }
files() { find "$DDTREE_BENCH_CACHE_DIR" -type f 2>/dev/null | wc -l; }
PAPER_TAU=16:8.6,32:9.3,64:9.75,128:10.2,256:10.4,512:10.73,1024:11.0

step env
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git rev-parse --short HEAD 2>/dev/null; } 2>&1 | tee -a "$LOG"

BENCH="python3 -m ddtree_bench bench-engine --shape qwen3-8b --device cuda --dtype bfloat16 --budgets 16..1024
  --prefix-len 1024 --no-plain --no-build-table --verify-tokens 1 --rounds ${ROUNDS:-5} --tau $PAPER_TAU"
for run in cold warm; do
  step "bench $run, cache files $(files)"
  timeout "$([ $run = cold ] && echo "${COLD_TIMEOUT:-170}" || echo "${WARM_TIMEOUT:-60}")" $BENCH \
    --out "$OUT/$run.json" 2> >(stamp > "$OUT/$run.log") | grep -v '^{' > "$OUT/$run.txt"
  echo "bench $run exit ${PIPESTATUS[0]}; cache files $(files)" | tee -a "$LOG"
done
if [ "${GRID_SMALL:-1}" = 1 ]; then
  export DDTREE_BENCH_CACHE_DIR=/tmp/ddtree-cold-cache-grid; rm -rf "$DDTREE_BENCH_CACHE_DIR"
  step "bench grid_small (B = 16, 32 with the grid build), cache files $(files)"
  timeout "${COLD_TIMEOUT:-170}" python3 -c "import sys; from ddtree_bench.engine.gpu import builders
builders.AUTO_BLOCK_MAX_BUDGET = 0
from ddtree_bench.cli import main
sys.argv = ['ddtree-bench'] + sys.argv[1:]
main()" $(echo $BENCH | sed 's/^python3 -m ddtree_bench //; s/--budgets 16..1024/--budgets 16,32/') \
    --out "$OUT/grid_small.json" 2> >(stamp > "$OUT/grid_small.log") | grep -v '^{' > "$OUT/grid_small.txt"
  echo "bench grid_small exit ${PIPESTATUS[0]}; cache files $(files)" | tee -a "$LOG"
fi
sleep 1   # the stamp pipes flush

python3 - "$OUT" <<'EOF' | tee -a "$LOG"
import re, sys
from datetime import datetime
out = sys.argv[1]
def gaps(name):
    lines = [l.rstrip("\n") for l in open(f"{out}/{name}.log")]
    t = lambda l: datetime.strptime(l[:12], "%H:%M:%S.%f")
    res = {}
    for i, l in enumerate(lines):
        m = re.search(r"\[bench-engine\] rounds ddtree (\d+)\s*$", l)
        if m and i + 1 < len(lines):
            nxt = next((x for x in lines[i + 1:] if "[bench-engine]" in x), None)
            if nxt:
                b = re.search(r"'tree_builder': '([^']+)'", nxt)
                res[int(m.group(1))] = (t(nxt) - t(l)).total_seconds(), b.group(1) if b else "?"
    return res
import os
cold, warm = gaps("cold"), gaps("warm")
grid = gaps("grid_small") if os.path.exists(f"{out}/grid_small.log") else {}
bs = sorted(set(cold) | set(warm))
print("seconds per budget from 'rounds ddtree B' to the next progress line (check + compile + capture + rounds):")
print("| B | " + " | ".join(map(str, bs)) + " |")
print("|---|" + "---|" * len(bs))
row = lambda name, r: print(f"| {name} | " + " | ".join(f"{r[b][0]:.1f} ({r[b][1]})" if b in r else "-" for b in bs) + " |")
row("fresh cache", cold)
row("second process, same cache", warm)
if grid:
    row("fresh cache, grid build at B <= 32", grid)
EOF

if [ "${FASTPATH_TESTS:-0}" = 1 ]; then
  step tests fastpath auto
  TRITON_CACHE_DIR=/tmp/triton-tests timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/engine/gpu/test_fastpath_cuda.py -k auto > "$OUT/tests_fastpath.txt" 2>&1
  echo "tests fastpath exit $?: $(tail -1 "$OUT/tests_fastpath.txt")" | tee -a "$LOG"
fi
step done
