#!/usr/bin/env bash
# Nsight Compute over one layer of the verify forward per n (benchmarks/gpu_ncu_verify.py): for each kernel its
# duration, compute and memory throughput (% of peak), occupancy, launch shape and the warp stall reasons, so a kernel
# that runs below its roofline says why (latency, memory, issue). One ncu report per n, $OUT/ncu_<n><TAG>.txt, and its
# one-line-a-kernel summary (benchmarks/ncu_summary.py) on stdout. Clocks are left alone (--clock-control none:
# METHOD.md). KERNELS: an ncu --kernel-name regex (e.g. "regex:_tree_attn|_combine"; then SKIP / COUNT count only
# those launches); SECTIONS: ncu sections (default the six below); TAG: a suffix for the report names, so arms run
# under different knobs keep their files apart. Run from the repo root:
#   TOKENS=16,128,256 SKIP=40 COUNT=12 bash benchmarks/gpu_ncu.sh
#   DDTREE_TREE_WIDE_RANGES=2 TAG=-r2 KERNELS="regex:_tree_attn|_combine" SKIP=0 COUNT=2 TOKENS=256 bash benchmarks/gpu_ncu.sh
set -u
source benchmarks/gpu_lib.sh
NCU=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)}
if [ -z "$NCU" ]; then echo "gpu_ncu: no ncu on this machine (set NCU=path)" | tee -a "$LOG" >&2; exit 2; fi
sections=()
for s in ${SECTIONS:-SpeedOfLight LaunchStats Occupancy WarpStateStats ComputeWorkloadAnalysis MemoryWorkloadAnalysis}; do
  sections+=(--section "$s")
done
filter=()
[ -n "${KERNELS:-}" ] && filter=(--kernel-name "$KERNELS")
IFS=, read -ra NS <<< "${TOKENS:-16,128,256}"
for n in "${NS[@]}"; do
  report="$OUT/ncu_$n${TAG:-}.txt"
  step "ncu n=$n${TAG:+ ($TAG)}"
  timeout "${NCU_TIMEOUT:-200}" "$NCU" --clock-control none --profile-from-start off "${filter[@]}" \
    --launch-skip "${SKIP:-40}" --launch-count "${COUNT:-12}" "${sections[@]}" \
    python3 benchmarks/gpu_ncu_verify.py --tokens "$n" > "$report" 2>&1
  echo "ncu n=$n: exit $?" | tee -a "$LOG"
  python3 benchmarks/ncu_summary.py "$report" | tee -a "$LOG"
done
