#!/usr/bin/env bash
# One device call for the speed work (issue 35): the whole GPU suite (benchmarks/gpu_suite.sh), then on the Qwen3-8B
# shape (random bf16 weights, 1024-token prefix) the batched fast loop against the single fast loop at batch
# BATCHES (default 1,2,4,16; batch 1 also in a loop of max(BATCHES) slots, as `serve --max-batch N` at concurrency 1)
# for AR, DFlash and DDTree at BUDGETS (default 16,64), on a FRESH Triton cache (so the single loop's first rounds,
# AR first as a sweep runs it, are the cold start per budget), then bench-engine's verify table (GEMM-only time,
# both ratios, GB/s, TFLOP/s per n) and rounds in a second process on that now-warm cache (its `cold s` column:
# what a second run pays). SUITE=0 / BATCH=0 / VERIFY=0 skip a step; PROFILE=1 adds --profile to the verify step
# (per-kernel times of the forward, cuBLAS forward and GEMM-only graph), VERIFY_TOKENS picks its n, CLOCKS=1 samples
# the SM clock / power / throttle reasons during it (clocks.csv). SOLO=1 adds benchmarks/gpu_serve_solo.py (one
# request at a time through the batched engine's scheduler vs the single loop: solo.txt); COLD=1 adds the cold start
# of COLD_BUDGETS (default 128,256,512,1024) after AR and DFlash on another fresh Triton cache (cold.txt: the rounds'
# `cold s` column); EXTRA='cmd' runs one more command last (extra.txt). Each step has its own limit (*_TIMEOUT, s).
# Files under $OUT (<= 8): session.txt, suite.txt, batch.txt, batch.json, batch.csv, verify.txt, verify.json,
# solo.txt, cold.txt, extra.txt, clocks.csv (skip steps to stay within 8).
# Run from the repo root:  OUT=/tmp/out bash benchmarks/gpu_speed.sh
source "$(dirname "$0")/gpu_lib.sh"
if [ "${SUITE:-1}" = 1 ]; then
  step "gpu suite"
  SUITE_TIMEOUT=${SUITE_TIMEOUT:-360} bash "$(dirname "$0")/gpu_suite.sh" > "$OUT/suite.txt" 2>&1
  echo "suite: $(tail -1 "$OUT/suite.txt")" | tee -a "$LOG"
  grep -E "passed|failed" "$OUT/suite.txt" | tail -2 | tee -a "$LOG"
fi
export TRITON_CACHE_DIR=/tmp/triton-speed-fresh   # kernels/cache_dir.py: the user's TRITON_CACHE_DIR wins
rm -rf "$TRITON_CACHE_DIR"
if [ "${BATCH:-1}" = 1 ]; then
  step "batched vs single loop (fresh Triton cache)"
  timeout ${BATCH_TIMEOUT:-200} python3 -m ddtree_bench bench-engine --shape qwen3-8b --device cuda --dtype bfloat16 \
    --batch "${BATCHES:-1,2,4,16}" --budgets "${BUDGETS:-16,64}" --prefix-len 1024 --rounds 5 --tau "$PAPER_TAU" \
    --out "$OUT/batch.json" 2>&1 | grep -v '^{' > "$OUT/batch.txt"
  echo "batch exit ${PIPESTATUS[0]}" | tee -a "$LOG"
fi
if [ "${VERIFY:-1}" = 1 ]; then
  step "verify table and rounds (second process, warm cache)${PROFILE:+, with the per-kernel profile}"
  if [ "${CLOCKS:-0}" = 1 ]; then   # SM clock, power and throttle reasons every 100 ms while the verify bench runs
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.max.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
      --format=csv -lms 100 > "$OUT/clocks.csv" 2>&1 &
    SMI=$!
  fi
  timeout ${VERIFY_TIMEOUT:-110} python3 -m ddtree_bench bench-engine --shape qwen3-8b --device cuda --dtype bfloat16 \
    --budgets "${VERIFY_BUDGETS:-16}" --prefix-len 1024 --rounds 5 --no-plain --no-build-table --tau "$PAPER_TAU" \
    --verify-tokens "${VERIFY_TOKENS:-1,16,64,128,256,512,1024}" ${PROFILE:+--profile} --out "$OUT/verify.json" 2>&1 \
    | grep -v '^{' > "$OUT/verify.txt"
  echo "verify exit ${PIPESTATUS[0]}" | tee -a "$LOG"
  [ -n "${SMI:-}" ] && kill "$SMI" 2> /dev/null
fi
if [ "${SOLO:-0}" = 1 ]; then
  step "one request at a time: batched scheduler vs single loop"
  timeout ${SOLO_TIMEOUT:-120} python3 benchmarks/gpu_serve_solo.py --shape qwen3-8b --budgets "${BUDGETS:-16,64}" \
    --slots 16 > "$OUT/solo.txt" 2>&1
  echo "solo exit $?" | tee -a "$LOG"
fi
if [ "${COLD:-0}" = 1 ]; then
  step "cold start per budget (fresh Triton cache)"
  rm -rf /tmp/triton-speed-cold
  TRITON_CACHE_DIR=/tmp/triton-speed-cold timeout ${COLD_TIMEOUT:-150} python3 -m ddtree_bench bench-engine --shape qwen3-8b \
    --device cuda --dtype bfloat16 --budgets "${COLD_BUDGETS:-128,256,512,1024}" --prefix-len 1024 --rounds 3 --no-plain \
    --no-build-table --verify-tokens 1 --tau "$PAPER_TAU" 2>&1 | grep -v '^{' > "$OUT/cold.txt"
  echo "cold exit ${PIPESTATUS[0]}" | tee -a "$LOG"
fi
if [ -n "${EXTRA:-}" ]; then
  step "extra: $EXTRA"
  timeout ${EXTRA_TIMEOUT:-150} bash -c "$EXTRA" > "$OUT/extra.txt" 2>&1
  echo "extra exit $?" | tee -a "$LOG"
fi
step done
