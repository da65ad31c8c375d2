#!/usr/bin/env bash
# Issue 20's few-row GEMM device call: tune kernels/gemm.py against cuBLAS on every Qwen3-8B projection and row
# band (benchmarks/gpu_gemm_tune.py, the table to $OUT/gemm_table.json), then bench-engine's verify curve with that
# table (DDTREE_GEMM_TABLE) and --profile: graph (the table's GEMMs) beside graph_cublas (every GEMM on cuBLAS),
# kernel families per n. ROWS picks the row counts (default every band), TESTS=1 also runs the GEMM GPU tests
# first (EXTRA_TESTS: more test files), TABLE=<json> (or builtin: gemm.H200_TABLE) skips the tuning, PROFILE=0 the profile,
# DEEP=1 repeats the profile on deep trees (profile_deep.txt),
# EXPERIMENTAL=pdl,split-cap then repeats tests, tuning and bench with those features on
# (DDTREE_GPU_EXPERIMENTAL, kernels/experimental.py); EXPERIMENTAL_TUNE=0 benches them on $TABLE instead of a
# retune, EACH=1 then benches each feature alone too (experimental_each.txt). With both TESTS=1 and EXPERIMENTAL,
# split it in two calls (TESTS=1, then TABLE=builtin EXPERIMENTAL=...) to stay under a call's 10 minutes.
# Files under $OUT (<= 8): session.txt, tune.txt, gemm_table.json, tests.txt, profile.{json,txt}, stderr.log,
# [experimental_tune.txt, experimental.{json,txt}, experimental_each.txt] (with TABLE set, no tune.txt / gemm_table.json).
# Run from the repo root:  OUT=/tmp/out bash benchmarks/gpu_gemm.sh
source "$(dirname "$0")/gpu_lib.sh"
if [ "${TESTS:-0}" = 1 ]; then
  step gpu tests
  timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -p no:cacheprovider -m gpu -q -rf tests/engine/gpu/test_gemm_triton.py \
    ${EXTRA_TESTS:-} tests/engine/gpu/test_gemm_cuda.py > "$OUT/tests.txt" 2>&1
  echo "pytest exit $?: $(tail -1 "$OUT/tests.txt")" | tee -a "$LOG"
fi
if [ -z "${TABLE:-}" ]; then
  step tune
  timeout ${TUNE_TIMEOUT:-330} python3 benchmarks/gpu_gemm_tune.py --rows "${ROWS:-1,16,64,128,32,256}" \
    --write "$OUT/gemm_table.json" > "$OUT/tune.txt" 2>&1
  echo "tune exit $?" | tee -a "$LOG"; TABLE="$OUT/gemm_table.json"
fi
profile() {   # profile NAME TABLE: bench-engine's verify curve with --profile, text to $OUT/NAME.txt (JSON: $JSON_DIR)
  DDTREE_GEMM_TABLE="$2" timeout ${PROFILE_TIMEOUT:-200} python3 -m ddtree_bench bench-engine --shape qwen3-8b \
    --device cuda --dtype bfloat16 --budgets 16 --prefix-len 1024 --rounds 5 --no-plain --no-build-table \
    --tau "$PAPER_TAU" --profile --verify-tokens 1,16,64,128,256,512,1024 --out "${JSON_DIR:-$OUT}/$1.json" \
    --curve-logit-scale "${CURVE_SCALE:-3}" \
    2>> "$OUT/stderr.log" | grep -v '^{'
  return "${PIPESTATUS[0]}"
}
[ "$TABLE" = builtin ] && TABLE=   # the code's own table (gemm.H200_TABLE)
if [ "${PROFILE:-1}" = 1 ]; then   # PROFILE=0: tune only (a table of a few ROWS leaves the other bands on cuBLAS)
  step profile
  profile profile "$TABLE" > "$OUT/profile.txt"
  echo "profile exit $?" | tee -a "$LOG"
  if [ "${DEEP:-0}" = 1 ]; then   # the same on deep trees (draft logits x 12: depth up to 15, a confident drafter)
    step "profile, deep trees"
    CURVE_SCALE=12 JSON_DIR=/tmp profile profile_deep "$TABLE" > "$OUT/profile_deep.txt"
    echo "profile (deep) exit $?" | tee -a "$LOG"
  fi
fi
if [ -n "${EXPERIMENTAL:-}" ]; then   # features not yet run on a GPU (kernels/experimental.py): tests, own table, bench
  export DDTREE_GPU_EXPERIMENTAL="$EXPERIMENTAL"
  step "experimental ($EXPERIMENTAL) tests"
  timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -p no:cacheprovider -m gpu -q -rf tests/engine/gpu/test_gemm_cuda.py \
    tests/engine/gpu/test_fused_triton.py tests/engine/gpu/test_fastloop_cuda.py \
    ${EXTRA_TESTS:-} >> "$OUT/tests.txt" 2>&1
  echo "pytest ($EXPERIMENTAL) exit $?: $(tail -1 "$OUT/tests.txt")" | tee -a "$LOG"
  XTABLE="$TABLE"
  if [ "${EXPERIMENTAL_TUNE:-1}" = 1 ]; then   # pdl changes the GEMMs' timing: their own table
    step "experimental tune"
    timeout ${TUNE_TIMEOUT:-330} python3 benchmarks/gpu_gemm_tune.py --rows "${ROWS:-1,16,64,128,32,256}" \
      --write /tmp/gemm_table_experimental.json > "$OUT/experimental_tune.txt" 2>&1   # the table is also its last line
    echo "experimental tune exit $?" | tee -a "$LOG"; XTABLE=/tmp/gemm_table_experimental.json
  fi
  step "experimental profile"
  profile experimental "$XTABLE" > "$OUT/experimental.txt"
  echo "experimental profile exit $?" | tee -a "$LOG"
  if [ "${EACH:-0}" = 1 ]; then   # each feature alone, same table: which one helps (JSON to /tmp, text in one file)
    for f in ${EXPERIMENTAL//,/ }; do
      step "experimental $f alone"
      echo "## DDTREE_GPU_EXPERIMENTAL=$f" >> "$OUT/experimental_each.txt"
      DDTREE_GPU_EXPERIMENTAL="$f" JSON_DIR=/tmp profile "experimental_$f" "$XTABLE" >> "$OUT/experimental_each.txt"
      echo "experimental $f exit $?" | tee -a "$LOG"
    done
  fi
fi
step done
