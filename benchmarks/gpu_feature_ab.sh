#!/usr/bin/env bash
# One device call: the retuned defaults' GPU tests, then every experimental feature against the
# defaults in ONE process (benchmarks/gpu_verify_ab.py: graphs captured per arm, timed round-robin, logits
# checked against the defaults'), on wide and deep curve trees, then bench-engine's verify curve + profile of
# the defaults (the n-by-n roofline table; PROFILE=0 skips it; PROJECTIONS=1 adds each weight projection's GEMMs against
# their own floor). ARMS overrides the arms (one per line: 'NAME
# VAR=VALUE ...'); TESTS=0 skips the tests (EXTRA_TESTS: more pytest arguments).
# Files under $OUT: session.txt, tests.txt, ab.txt, ab.json, ab_stderr.log, profile.txt, profile.json, stderr.log
# Run from the repo root:  OUT=/tmp/out bash benchmarks/gpu_feature_ab.sh
source "$(dirname "$0")/gpu_lib.sh"
X=DDTREE_GPU_EXPERIMENTAL
ARMS=${ARMS:-"after
before DDTREE_TREE_RANGES_TO=384 DDTREE_COMBINE_ROWS_FROM=100000 DDTREE_ROPE_TILES_FROM=100000
rows1 DDTREE_COMBINE_ROWS_FROM=100000"}
if [ "${TESTS:-1}" = 1 ]; then
  step gpu tests
  timeout ${TESTS_TIMEOUT:-170} python3 -m pytest -p no:cacheprovider -m gpu -q -rf tests/engine/gpu/test_fused_triton.py \
    tests/engine/gpu/test_attention_cuda.py ${EXTRA_TESTS:-} > "$OUT/tests.txt" 2>&1
  echo "pytest exit $?: $(tail -1 "$OUT/tests.txt")" | tee -a "$LOG"
fi
step "a/b ($(echo "$ARMS" | cut -d' ' -f1 | tr '\n' ' '))"
args=(); while IFS= read -r a; do [ -n "$a" ] && args+=(--arm "$a"); done <<< "$ARMS"
timeout ${AB_TIMEOUT:-300} python3 benchmarks/gpu_verify_ab.py "${args[@]}" --tokens "${TOKENS:-1,16,64,128,256,512,1024}" \
  --scales "${SCALES:-3,12}" --rounds "${ROUNDS:-7}" --reps "${REPS:-20}" --out "$OUT/ab.json" > "$OUT/ab.txt" 2> "$OUT/ab_stderr.log"
echo "a/b exit $?" | tee -a "$LOG"
if [ "${PROFILE:-1}" = 1 ]; then
  step profile
  timeout ${PROFILE_TIMEOUT:-150} python3 -m ddtree_bench bench-engine --shape qwen3-8b --device cuda --dtype bfloat16 \
    --budgets 16 --prefix-len 1024 --rounds 5 --no-plain --no-build-table --tau "$PAPER_TAU" --profile \
    --verify-tokens 1,16,64,128,256,512,1024 $([ "${PROJECTIONS:-0}" = 1 ] && echo --projections) --out "$OUT/profile.json" 2>> "$OUT/stderr.log" | grep -v '^{' > "$OUT/profile.txt"
  echo "profile exit ${PIPESTATUS[0]}" | tee -a "$LOG"
fi
step done
