#!/usr/bin/env bash
# One device call (issue 20): the tree attention's GPU tests and tuning table (gpu_tree_attention.sh's first two
# steps), then the cold-start table (gpu_cold_start.sh). Files under $OUT: tests.txt, tune.{txt,json}, cold/.
#   OUT=/tmp/out bash benchmarks/gpu_call_tune_cold.sh
set -u
OUT=${OUT:-/tmp/ddtree-gpu}; mkdir -p "$OUT/cold"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
echo "== tests $(date -u +%T)"
TRITON_CACHE_DIR=/tmp/triton-tests timeout ${TESTS_TIMEOUT:-90} python3 -m pytest -p no:cacheprovider -m gpu -q -x \
  tests/engine/gpu/test_attention_triton.py > "$OUT/tests.txt" 2>&1; echo "pytest exit $?: $(tail -1 "$OUT/tests.txt")"
echo "== tune $(date -u +%T)"
TRITON_CACHE_DIR=/tmp/triton-tests timeout ${TUNE_TIMEOUT:-150} python3 benchmarks/gpu_attention_tune.py --out "$OUT/tune.json" > "$OUT/tune.txt" 2>&1
echo "tune exit $?"
echo "== cold $(date -u +%T)"
OUT="$OUT/cold" bash benchmarks/gpu_cold_start.sh > /dev/null 2>&1; echo "cold exit $?"
echo "== done $(date -u +%T)"
