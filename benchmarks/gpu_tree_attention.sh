#!/usr/bin/env bash
# Issue 20, the verify's tree attention (kernels/tree_attention.py) on one GPU, one device call: its GPU tests
# (fp32 against SDPA, bf16, the whole forwards), the attention alone per tree size and launch shape
# (benchmarks/gpu_attention_tune.py), then bench-engine's verify curve on the Qwen3-8B shape (random bf16
# weights, 1024-token prefix, DDTree-shaped trees) with --profile, and rounds at AR, DFlash and B = 16, 64,
# 256, 1024 (the overhead share). Files under $OUT: session.txt, tests.txt, tune.{txt,json},
# bench.{json,txt,log}. Run from the repo root:  OUT=/tmp/out bash benchmarks/gpu_tree_attention.sh
source "$(dirname "$0")/gpu_lib.sh"
step gpu tests
timeout ${TESTS_TIMEOUT:-100} python3 -m pytest -p no:cacheprovider -m gpu -q -x \
  tests/engine/gpu/test_attention_triton.py ${EXTRA_TESTS:-} > "$OUT/tests.txt" 2>&1
echo "pytest exit $?: $(tail -1 "$OUT/tests.txt")" | tee -a "$LOG"
step tune
timeout ${TUNE_TIMEOUT:-120} python3 benchmarks/gpu_attention_tune.py --out "$OUT/tune.json" > "$OUT/tune.txt" 2>&1
echo "tune exit $?" | tee -a "$LOG"
step bench
timeout ${BENCH_TIMEOUT:-200} python3 -m ddtree_bench bench-engine --shape qwen3-8b --device cuda --dtype bfloat16 \
  --budgets ${BUDGETS:-16,64,256,1024} --prefix-len 1024 --rounds 10 --no-plain --no-build-table --tau "$PAPER_TAU" \
  --verify-tokens 1,16,64,128,256,512,1024 ${PROFILE:---profile} --out "$OUT/bench.json" 2> "$OUT/bench.log" \
  | grep -v '^{' > "$OUT/bench.txt"
echo "bench exit ${PIPESTATUS[0]}" | tee -a "$LOG"
step done
