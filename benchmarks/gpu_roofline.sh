#!/usr/bin/env bash
# Issue 20 items 1-3 on one GPU, one device call: the live-slot attention kernel's GPU tests, then
# bench-engine on the Qwen3-8B shape (random bf16 weights, 1024-token prefix) with --profile on a cold
# project cache (DDTREE_BENCH_CACHE_DIR fresh, TRITON_CACHE_DIR unset: the default rule), then a second
# process on the same cache (rounds at every budget again: what a new budget costs once compiled, and
# whether anything was recompiled: the cache's file count before and after).
# Files under $OUT: session.txt, tests.txt, bench_cold.{json,txt,log}, bench_warm.{txt,log} (.log: timestamped
# progress lines). Run from the repo root: OUT=/tmp/out bash benchmarks/gpu_roofline.sh
# Knobs: TESTS (pytest files, "" to skip), COLD_TIMEOUT, WARM_TIMEOUT, ROUNDS.
set -u
OUT=${OUT:-/tmp/ddtree-gpu}; mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
unset TRITON_CACHE_DIR
export DDTREE_BENCH_CACHE_DIR=/tmp/ddtree-cache; rm -rf "$DDTREE_BENCH_CACHE_DIR"
LOG="$OUT/session.txt"
step() { echo "== $* ($(date -u +%FT%T.%3NZ))" | tee -a "$LOG"; }
stamp() { while IFS= read -r l; do echo "$(date -u +%T.%3N) $l"; done; }
files() { find "$DDTREE_BENCH_CACHE_DIR" -type f 2>/dev/null | wc -l; }
PAPER_TAU=16:8.6,32:9.3,64:9.75,128:10.2,256:10.4,512:10.73,1024:11.0
TESTS=${TESTS-tests/engine/gpu/test_attention_cuda.py tests/engine/gpu/test_attention_triton.py}

step env
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"; } 2>&1 | tee -a "$LOG"

if [ -n "$TESTS" ]; then
  step tests $TESTS
  timeout ${TESTS_TIMEOUT:-60} python3 -m pytest -q -p no:cacheprovider -m gpu $TESTS > "$OUT/tests.txt" 2>&1
  echo "tests exit $?: $(tail -1 "$OUT/tests.txt")" | tee -a "$LOG"
fi

BENCH="python3 -m ddtree_bench bench-engine --shape qwen3-8b --device cuda --dtype bfloat16 --budgets 16..1024 --prefix-len 1024 --no-plain --no-build-table --tau $PAPER_TAU"
step bench cold cache, files $(files)
timeout ${COLD_TIMEOUT:-170} $BENCH --rounds ${ROUNDS:-20} --verify-tokens 1,16,64,128,256,512,1024 --profile \
  --out "$OUT/bench_cold.json" 2> >(stamp > "$OUT/bench_cold.log") | grep -v '^{' > "$OUT/bench_cold.txt"
echo "bench cold exit ${PIPESTATUS[0]}; cache files $(files)" | tee -a "$LOG"

step bench warm, same cache, files $(files)
timeout ${WARM_TIMEOUT:-45} $BENCH --rounds 5 --verify-tokens 1 2> >(stamp > "$OUT/bench_warm.log") | grep -v '^{' > "$OUT/bench_warm.txt"
echo "bench warm exit ${PIPESTATUS[0]}; cache files $(files)" | tee -a "$LOG"
step done
