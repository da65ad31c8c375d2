#!/usr/bin/env bash
# One device call for issue 20: the Qwen3-8B shape's verify table against roofline(n) (bench-engine on random
# bf16 weights, 1024-token prefix, n = 1/16/64/128/256/512/1024, rounds at every budget) on a cold Triton cache,
# then the toy pair's rounds at every budget twice with one persistent TRITON_CACHE_DIR (cold, then a second
# process on the same cache): the seconds each budget's first use costs, from the timestamped progress lines.
# Files under $OUT: session.txt, bench_qwen3-8b.{json,txt} (+ .log: timestamped progress), toy_cold.log,
# toy_warm.log. Run from the repo root: OUT=/tmp/out bash benchmarks/gpu_issue20.sh
set -u
OUT=${OUT:-/tmp/ddtree-gpu}; mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
LOG="$OUT/session.txt"
step() { echo "== $* ($(date -u +%FT%T.%3NZ))" | tee -a "$LOG"; }
stamp() { while IFS= read -r l; do echo "$(date -u +%T.%3N) $l"; done; }
PAPER_TAU=16:8.6,32:9.3,64:9.75,128:10.2,256:10.4,512:10.73,1024:11.0

step env
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"; } 2>&1 | tee -a "$LOG"

step bench qwen3-8b, cold Triton cache
export TRITON_CACHE_DIR=/tmp/triton-8b; rm -rf "$TRITON_CACHE_DIR"
timeout ${BENCH8B_TIMEOUT:-270} python3 -m ddtree_bench bench-engine --shape qwen3-8b --device cuda --dtype bfloat16 \
  --budgets 16..1024 --prefix-len 1024 --rounds ${ROUNDS:-20} --verify-tokens 1,16,64,128,256,512,1024 --tau "$PAPER_TAU" \
  --no-plain --no-build-table --out "$OUT/bench_qwen3-8b.json" 2> >(stamp > "$OUT/bench_qwen3-8b.log") | grep -v '^{' > "$OUT/bench_qwen3-8b.txt"
echo "bench qwen3-8b exit ${PIPESTATUS[0]}" | tee -a "$LOG"

export TRITON_CACHE_DIR=/tmp/triton-toy; rm -rf "$TRITON_CACHE_DIR"
for run in cold warm; do
  step toy $run
  timeout ${TOY_TIMEOUT:-110} python3 -m ddtree_bench bench-engine --model toy --device cuda --dtype float32 --budgets 16..1024 \
    --prefix-len 512 --rounds 5 --verify-tokens 1 --no-plain --no-e2e --no-build-table 2>&1 >/dev/null | stamp > "$OUT/toy_$run.log"
  echo "toy $run exit ${PIPESTATUS[0]}; cache files $(find $TRITON_CACHE_DIR -type f | wc -l)" | tee -a "$LOG"
done
step done
