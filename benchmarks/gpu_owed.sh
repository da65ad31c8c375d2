#!/usr/bin/env bash
# The call issue 35 owed a GPU on 2026-12-07 (docs/gpu-performance.md, "Known gaps"): the corrected norm ceiling and
# the attention ceiling (gpu_ceilings.py, its `nonorm` feeding the next GEMM normal data) with the SM clock and power
# sampled beside it (clocks.csv: whether the card sits at its power cap where the raw arm beat the floor), the whole
# suite, and on an H200 the untried A/B of gate/up + SiLU and lm_head on Triton at 65-128 rows. Every step's
# limit is cut to what is left of LIMIT s (default 570). Files under $OUT: session.txt, clocks.csv, ceil.txt,
# ceil.json, suite.txt, vab.txt.
#   OUT=/tmp/out bash benchmarks/gpu_owed.sh      # carry [".whl-speed"]
source "$(dirname "$0")/gpu_lib.sh"
T0=$(date +%s)
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - T0) )); }
cap() { local l; l=$(( $(left) - 10 )); (( l < 1 )) && l=1; echo $(( l < $1 ? l : $1 )); }
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 250 > "$OUT/clocks.csv" 2>&1 &
SMI=$!
step "ceilings"
timeout "$(cap 200)" python3 benchmarks/gpu_ceilings.py --tokens ${TOKENS:-64,128,256,512,1024} --rounds 5 \
  --out "$OUT/ceil.json" > "$OUT/ceil.txt" 2>&1; echo "ceilings exit $?" | tee -a "$LOG"
kill "$SMI" 2>/dev/null
step "suite"
WHL=${WHL:-.whl-speed} SUITE_TIMEOUT=$(cap 300) bash "$(dirname "$0")/gpu_suite.sh" > "$OUT/suite.txt" 2>&1
tail -2 "$OUT/suite.txt" | tee -a "$LOG"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  if [ "$(left)" -gt 120 ]; then
    step "gate/up + lm_head A/B"
    python3 benchmarks/gemm_table_bands.py --base h200 --above 64 --out /tmp/gu97.json \
      --set "gate_up:96=cublas,128=64x64x128/1/4/4" --set "lm_head:96=cublas,128=128x128x128/1/4/3" > /dev/null
    python3 benchmarks/gemm_table_bands.py --base h200 --above 64 --out /tmp/m128.json \
      --set "gate_up:128=128x64x128/1/8/3" --set "lm_head:128=128x128x128/1/4/3" > /dev/null
    timeout "$(cap 200)" python3 benchmarks/gpu_verify_ab.py --arm default --arm "gu97 DDTREE_GEMM_TABLE=/tmp/gu97.json" \
      --arm "m128 DDTREE_GEMM_TABLE=/tmp/m128.json" --tokens 65,80,97,112,128 --scales 3 --rounds 7 --gemm-only \
      > "$OUT/vab.txt" 2>&1; echo "vab exit $?" | tee -a "$LOG"
  fi
fi
step "done"
