#!/usr/bin/env bash
# Nsight Compute over one layer of the verify forward per n (benchmarks/gpu_ncu_verify.py): for each kernel its
# duration, compute and memory throughput (% of peak), DRAM bytes, occupancy, launch shape and the warp stall
# reasons, so a kernel that runs below its roofline says why (latency, memory, issue). One ncu file per n:
# $OUT/ncu_<n>.txt. Clocks are left alone (--clock-control none: METHOD.md). Run from the repo root:
#   TOKENS=16,128,256 SKIP=40 COUNT=12 bash benchmarks/gpu_ncu.sh
set -u
source benchmarks/gpu_lib.sh
NCU=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)}
if [ -z "$NCU" ]; then echo "gpu_ncu: no ncu on this machine" | tee -a "$LOG"; exit 0; fi
IFS=, read -ra NS <<< "${TOKENS:-16,128,256}"
for n in "${NS[@]}"; do
  step "ncu n=$n"
  timeout "${NCU_TIMEOUT:-200}" "$NCU" --clock-control none --profile-from-start off \
    --launch-skip "${SKIP:-40}" --launch-count "${COUNT:-12}" \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    python3 benchmarks/gpu_ncu_verify.py --tokens "$n" > "$OUT/ncu_$n.txt" 2>&1
  echo "ncu n=$n: exit $? ($(grep -c '^  [^ ].*(' "$OUT/ncu_$n.txt") kernel sections)" | tee -a "$LOG"
done
