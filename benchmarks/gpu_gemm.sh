#!/usr/bin/env bash
# Issue 20's few-row GEMM device call: tune kernels/gemm.py against cuBLAS on every Qwen3-8B projection and row
# band (benchmarks/gpu_gemm_tune.py, the table to $OUT/gemm_table.json), then bench-engine's verify curve with that
# table (DDTREE_GEMM_TABLE) and --profile: graph (the table's GEMMs) beside graph_cublas (every GEMM on cuBLAS),
# kernel families per n. ROWS picks the row counts (default every band), TESTS=1 also runs the GEMM GPU tests
# first (EXTRA_TESTS: more test files), TABLE=<json> (or builtin: gemm.H200_TABLE) skips the tuning,
# EXPERIMENTAL=pdl,fused-reduce then repeats tests, tuning and bench with those features on
# (DDTREE_GPU_EXPERIMENTAL, kernels/experimental.py); with both, split it in two calls (TESTS=1, then
# TABLE=builtin EXPERIMENTAL=...) to stay under a call's 10 minutes. Files under $OUT (<= 8): session.txt, tune.txt, gemm_table.json, tests.txt,
# profile.{json,txt}, stderr.log, [experimental_tune.txt, experimental.{json,txt}].
# Run from the repo root:  OUT=/tmp/out bash benchmarks/gpu_gemm.sh
source "$(dirname "$0")/gpu_lib.sh"
if [ "${TESTS:-0}" = 1 ]; then
  step gpu tests
  timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -p no:cacheprovider -m gpu -q -rf tests/engine/gpu/test_gemm_cuda.py \
    tests/engine/gpu/test_gemm_triton.py ${EXTRA_TESTS:-} > "$OUT/tests.txt" 2>&1
  echo "pytest exit $?: $(tail -1 "$OUT/tests.txt")" | tee -a "$LOG"
fi
if [ -z "${TABLE:-}" ]; then
  step tune
  timeout ${TUNE_TIMEOUT:-330} python3 benchmarks/gpu_gemm_tune.py --rows "${ROWS:-1,16,64,128,32,256}" \
    --write "$OUT/gemm_table.json" > "$OUT/tune.txt" 2>&1
  echo "tune exit $?" | tee -a "$LOG"; TABLE="$OUT/gemm_table.json"
fi
step profile
[ "$TABLE" = builtin ] && TABLE=   # the code's own table (gemm.H200_TABLE)
DDTREE_GEMM_TABLE="$TABLE" timeout ${PROFILE_TIMEOUT:-200} python3 -m ddtree_bench bench-engine --shape qwen3-8b \
  --device cuda --dtype bfloat16 --budgets 16 --prefix-len 1024 --rounds 5 --no-plain --no-build-table --tau "$PAPER_TAU" \
  --profile --verify-tokens 1,16,64,128,256,512,1024 --out "$OUT/profile.json" 2>> "$OUT/stderr.log" \
  | grep -v '^{' > "$OUT/profile.txt"
echo "profile exit ${PIPESTATUS[0]}" | tee -a "$LOG"
if [ -n "${EXPERIMENTAL:-}" ]; then   # features not yet run on a GPU (kernels/experimental.py): tests, own table, bench
  export DDTREE_GPU_EXPERIMENTAL="$EXPERIMENTAL"
  step "experimental ($EXPERIMENTAL) tests"
  timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -p no:cacheprovider -m gpu -q -rf tests/engine/gpu/test_gemm_cuda.py \
    tests/engine/gpu/test_fused_triton.py tests/engine/gpu/test_fastloop_cuda.py >> "$OUT/tests.txt" 2>&1
  echo "pytest ($EXPERIMENTAL) exit $?: $(tail -1 "$OUT/tests.txt")" | tee -a "$LOG"
  step "experimental tune"
  timeout ${TUNE_TIMEOUT:-330} python3 benchmarks/gpu_gemm_tune.py --rows "${ROWS:-1,16,64,128,32,256}" \
    --write /tmp/gemm_table_experimental.json > "$OUT/experimental_tune.txt" 2>&1   # the table is also its last line
  echo "experimental tune exit $?" | tee -a "$LOG"
  step "experimental profile"
  DDTREE_GEMM_TABLE=/tmp/gemm_table_experimental.json timeout ${PROFILE_TIMEOUT:-200} python3 -m ddtree_bench bench-engine \
    --shape qwen3-8b --device cuda --dtype bfloat16 --budgets 16 --prefix-len 1024 --rounds 5 --no-plain --no-build-table \
    --tau "$PAPER_TAU" --profile --verify-tokens 1,16,64,128,256,512,1024 --out "$OUT/experimental.json" 2>> "$OUT/stderr.log" \
    | grep -v '^{' > "$OUT/experimental.txt"
  echo "experimental profile exit ${PIPESTATUS[0]}" | tee -a "$LOG"
fi
step done
