#!/usr/bin/env bash
# The session's closing device call on the finished tree: every GPU test file of the fast path that
# this session's changes touch (live-slot attention, fast loop, batched fast loop and tree build, fused
# Triton ops), then the verify curve against the roofline on the Qwen3-8B shape (random bf16 weights,
# 1024-token prefix) with the per-round overhead at two budgets. Files under $OUT: session.txt,
# tests.txt, bench.{json,txt,log}. The tree-kernel test file is left out (unchanged kernels; it takes
# over 230 s on a cold Triton cache). Run from the repo root:  OUT=/tmp/out bash benchmarks/gpu_final.sh
source "$(dirname "$0")/gpu_lib.sh"
step gpu tests
timeout ${TESTS_TIMEOUT:-240} python3 -m pytest -p no:cacheprovider -m gpu -rA -q \
  tests/engine/gpu/test_attention_cuda.py tests/engine/gpu/test_attention_triton.py tests/engine/gpu/test_fastpath_cuda.py \
  tests/engine/gpu/test_fastloop_cuda.py tests/engine/gpu/test_batch_loop_cuda.py tests/engine/gpu/test_batch_tree_cuda.py \
  tests/engine/gpu/test_fused_triton.py > "$OUT/tests.txt" 2>&1
echo "pytest exit $?: $(tail -1 "$OUT/tests.txt")" | tee -a "$LOG"
step bench
timeout ${BENCH_TIMEOUT:-150} python3 -m ddtree_bench bench-engine --shape qwen3-8b --device cuda --dtype bfloat16 \
  --budgets 16,64 --prefix-len 1024 --rounds 10 --no-plain --no-build-table --tau "$PAPER_TAU" \
  --verify-tokens 1,16,64,128,256,512,1024 --out "$OUT/bench.json" 2> "$OUT/bench.log" | grep -v '^{' > "$OUT/bench.txt"
echo "bench exit ${PIPESTATUS[0]}" | tee -a "$LOG"
step done
