#!/usr/bin/env bash
# One device call to confirm a GPU change: the whole GPU suite (gpu_suite.sh), the A/B of ARMS on the verify forward
# (gpu_verify_ab.py) and on whole rounds at batch 1 and 2 (gpu_batch_ab.py), then the speed tables (gpu_speed.sh with
# SUITE=0 PROFILE=1: batched against single loop on a fresh Triton cache, the verify against its GEMM-only floor).
# Every step's limit is cut to what is left of LIMIT s (default 570, under the device's 600 s a command), in that
# order, so a short lease still brings back the suite first. CARD (e.g. H200): run nothing unless the GPU's name holds
# it (a request may be answered by another card). ARMS: one arm a line, 'NAME VAR=VALUE ...', the first the reference
# (default: the defaults against the old launches before dec08a7). Arms may name /tmp/ltd65.json and /tmp/ltd17.json:
# the H200 table with down above 64 (and o_proj above 17) rows on cuBLAS, written here when an arm names it.
# Files under $OUT (<= 8): session.txt, suite.txt, vab.txt, bab.txt, batch.txt, batch.csv, verify.txt, verify.json.
# Run from the repo root:  CARD=H200 OUT=/tmp/out bash benchmarks/gpu_confirm.sh      # carry [".whl-speed"]
source "$(dirname "$0")/gpu_lib.sh"
T0=$(date +%s)
left() { echo $(( ${LIMIT:-570} - ($(date +%s) - T0) )); }
cap() { local l; l=$(( $(left) - 10 )); (( l < 1 )) && l=1; echo $(( l < $1 ? l : $1 )); }   # a step's limit: $1 s, or what is left
if [ -n "${CARD:-}" ] && ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q "$CARD"; then
  echo "not the card asked for ($CARD): nothing run" | tee -a "$LOG"; exit 0
fi
step "suite"
WHL=${WHL:-.whl-speed} SUITE_TIMEOUT=$(cap 300) bash "$(dirname "$0")/gpu_suite.sh" > "$OUT/suite.txt" 2>&1
tail -2 "$OUT/suite.txt" | tee -a "$LOG"
ARMS=${ARMS:-"default
old DDTREE_GPU_EXPERIMENTAL=pdl-off,narrow-off"}
case "$ARMS" in *ltd65.json*)
  python3 benchmarks/gemm_table_bands.py --base h200 --above 64 --set "down:128=cublas" --out /tmp/ltd65.json > /dev/null;; esac
case "$ARMS" in *ltd17.json*)
  python3 benchmarks/gemm_table_bands.py --base h200 --above 17 --set "down:128=cublas" --set "o_proj:32=cublas" \
    --out /tmp/ltd17.json > /dev/null;; esac
A=(); while IFS= read -r a; do [ -n "$a" ] && A+=(--arm "$a"); done <<< "$ARMS"
if [ "$(left)" -gt 90 ]; then
  step "verify A/B"
  timeout "$(cap 150)" python3 benchmarks/gpu_verify_ab.py "${A[@]}" --tokens "${TOKENS:-1,16,17,32,48,64,65,128,129,256}" \
    --scales 3 --rounds 7 > "$OUT/vab.txt" 2>&1; echo "vab exit $?" | tee -a "$LOG"
fi
if [ "$(left)" -gt 60 ]; then
  step "batch A/B"
  timeout "$(cap 120)" python3 benchmarks/gpu_batch_ab.py "${A[@]}" --points ar,dflash,ddtree:16,ddtree:64 --batches 1,2 \
    > "$OUT/bab.txt" 2>&1; echo "bab exit $?" | tee -a "$LOG"
fi
if [ "$(left)" -gt 250 ]; then   # the batch table gets what the verify table's 110 s leave
  step "speed tables, $(left) s left"
  rm -rf /tmp/confirm-speed
  OUT=/tmp/confirm-speed SUITE=0 PROFILE=1 BATCH_TIMEOUT=$(( $(left) - 120 < 200 ? $(left) - 120 : 200 )) VERIFY_TIMEOUT=110 bash "$(dirname "$0")/gpu_speed.sh" \
    > /dev/null 2>&1
  cat /tmp/confirm-speed/session.txt >> "$LOG"
  cp /tmp/confirm-speed/{batch.txt,batch.csv,verify.txt,verify.json} "$OUT"/ 2> /dev/null
fi
step done
