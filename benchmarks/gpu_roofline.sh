#!/usr/bin/env bash
# Issue 20 items 1-3 on one GPU, one device call: the live-slot attention kernel's GPU tests; bench-engine on
# the Qwen3-8B shape (random bf16 weights, 1024-token prefix) with --profile on a cold project cache
# (DDTREE_BENCH_CACHE_DIR fresh, TRITON_CACHE_DIR unset: the default rule); while its rounds compile, the
# fast path's GPU tests (fp32 token for token against the plain loop); then a second bench process on the
# same cache (rounds at every budget again: what a new budget costs once compiled, the overhead share on an
# idle GPU, and whether anything was recompiled: the cache's file count before and after).
# Files under $OUT: session.txt, tests_attention.txt, tests_fastpath.txt, bench_cold.{json,txt,log},
# bench_warm.{json,txt,log} (.log: timestamped progress lines). Run from the repo root:
#   OUT=/tmp/out bash benchmarks/gpu_roofline.sh
# The tests compile into their own TRITON_CACHE_DIR, so the bench's cold cache stays cold.
# Knobs: COLD_TIMEOUT, WARM_TIMEOUT, TESTS_TIMEOUT, FASTPATH_TESTS ("" skips them).
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
FASTPATH_TESTS=${FASTPATH_TESTS-tests/engine/gpu/test_fastpath_cuda.py tests/engine/gpu/test_fused_triton.py}

step env
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"; } 2>&1 | tee -a "$LOG"

step tests attention
TRITON_CACHE_DIR=/tmp/triton-tests timeout 40 python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/gpu/test_attention_cuda.py tests/engine/gpu/test_attention_triton.py > "$OUT/tests_attention.txt" 2>&1
echo "tests attention exit $?: $(tail -1 "$OUT/tests_attention.txt")" | tee -a "$LOG"

BENCH="python3 -m ddtree_bench bench-engine --shape qwen3-8b --device cuda --dtype bfloat16 --budgets 16..1024 --prefix-len 1024 --no-plain --no-build-table --tau $PAPER_TAU"
step bench cold cache, files $(files)
( timeout ${COLD_TIMEOUT:-185} $BENCH --rounds 10 --verify-tokens 1,16,64,128,256,512,1024 --profile \
    --out "$OUT/bench_cold.json" 2> >(stamp > "$OUT/bench_cold.log") | grep -v '^{' > "$OUT/bench_cold.txt"
  echo "bench cold exit ${PIPESTATUS[0]}; cache files $(files)" | tee -a "$LOG"; step bench cold done ) &
COLD=$!
if [ -n "$FASTPATH_TESTS" ]; then   # after the verify curve (its timings must not share the GPU), during the cold rounds
  for _ in $(seq 120); do grep -q "rounds ar" "$OUT/bench_cold.log" 2>/dev/null && break; kill -0 $COLD 2>/dev/null || break; sleep 1; done
  step tests fastpath, during the cold rounds
  TRITON_CACHE_DIR=/tmp/triton-tests timeout ${TESTS_TIMEOUT:-120} python3 -m pytest -q -p no:cacheprovider -m gpu $FASTPATH_TESTS > "$OUT/tests_fastpath.txt" 2>&1
  echo "tests fastpath exit $?: $(tail -1 "$OUT/tests_fastpath.txt")" | tee -a "$LOG"
fi
wait $COLD

step bench warm, same cache, files $(files)
timeout ${WARM_TIMEOUT:-45} $BENCH --rounds 20 --verify-tokens 1 --out "$OUT/bench_warm.json" 2> >(stamp > "$OUT/bench_warm.log") \
  | grep -v '^{' > "$OUT/bench_warm.txt"
echo "bench warm exit ${PIPESTATUS[0]}; cache files $(files)" | tee -a "$LOG"
step done
