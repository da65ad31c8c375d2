#!/usr/bin/env bash
# Issue 20's closing device call with the tree attention: the GPU tests of the attention kernels and the fast
# loop (fp32 token for token against the plain loop, bf16 up to near ties, every tree builder); the attention
# alone on wide (logit scale 3) and deep (12) trees at the launch shape the engine picks; bench-engine on the
# Qwen3-8B shape (random bf16 weights, 1024-token prefix) without the profiler (the verify curve against the
# roofline, rounds and overhead at every budget, the calibrated cost model); then a second bench process with
# --profile (kernel families per n; the profiler's hooks can slow what runs after it, so it runs last).
# Files under $OUT: session.txt, tests.txt, tune_wide.txt, tune_deep.txt, bench.{json,txt,log},
# profile.{json,txt,log}. Run from the repo root:  OUT=/tmp/out bash benchmarks/gpu_final_tree.sh
source "$(dirname "$0")/gpu_lib.sh"
step bench
timeout ${BENCH_TIMEOUT:-200} python3 -m ddtree_bench bench-engine --shape qwen3-8b --device cuda --dtype bfloat16 \
  --budgets 16..1024 --prefix-len 1024 --rounds 10 --no-plain --no-build-table --tau "$PAPER_TAU" \
  --verify-tokens 1,16,64,128,256,512,1024 --out "$OUT/bench.json" 2> "$OUT/bench.log" | grep -v '^{' > "$OUT/bench.txt"
echo "bench exit ${PIPESTATUS[0]}" | tee -a "$LOG"
step tune
for w in "wide 3" "deep 12"; do set -- $w
  timeout 60 python3 benchmarks/gpu_attention_tune.py --logit-scale $2 --shapes picked > "$OUT/tune_$1.txt" 2>&1
  echo "tune $1 exit $?" | tee -a "$LOG"; done
step gpu tests
timeout ${TESTS_TIMEOUT:-200} python3 -m pytest -p no:cacheprovider -m gpu -q -rf \
  tests/engine/gpu/test_attention_triton.py tests/engine/gpu/test_fastpath_cuda.py tests/engine/gpu/test_fastloop_cuda.py \
  > "$OUT/tests.txt" 2>&1
echo "pytest exit $?: $(tail -1 "$OUT/tests.txt")" | tee -a "$LOG"
step profile
timeout ${PROFILE_TIMEOUT:-90} python3 -m ddtree_bench bench-engine --shape qwen3-8b --device cuda --dtype bfloat16 \
  --budgets 16 --prefix-len 1024 --rounds 3 --no-plain --no-build-table --tau "$PAPER_TAU" --profile \
  --verify-tokens 1,16,64,128,256,512,1024 --out "$OUT/profile.json" 2> "$OUT/profile.log" | grep -v '^{' > "$OUT/profile.txt"
echo "profile exit ${PIPESTATUS[0]}" | tee -a "$LOG"
step done
