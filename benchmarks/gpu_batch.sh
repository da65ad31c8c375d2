#!/usr/bin/env bash
# One device call for issue 19 items 1-2 on the GPU path: the batched fast loop's CUDA tests
# (tests/engine/gpu/test_batch_loop_cuda.py: graphs on, fp32 token for token, bf16 up to near ties), then
# bench-engine --batch on the Qwen3-8B shape (random bf16 weights, 1024-token prompts, tau supplied from the
# paper's curve as bench-engine does at batch 1): per (batch, budget) stage medians, the cold first round of
# each new (bucket, budget) shape and output tok/s.
# Files under $OUT: session.txt, test_cuda.txt, bench_batch_qwen3-8b.{json,csv,txt,log}.
# Run from the repo root: OUT=/tmp/out bash benchmarks/gpu_batch.sh
set -u
OUT=${OUT:-/tmp/ddtree-gpu}; mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
LOG="$OUT/session.txt"
step() { echo "== $* ($(date -u +%FT%T.%3NZ))" | tee -a "$LOG"; }
stamp() { while IFS= read -r l; do echo "$(date -u +%T.%3N) $l"; done; }
PAPER_TAU=16:8.6,32:9.3,64:9.75,128:10.2

step env
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"; } 2>&1 | tee -a "$LOG"

step cuda tests
timeout ${TEST_TIMEOUT:-110} python3 -m pytest -q -p no:cacheprovider tests/engine/gpu/test_batch_loop_cuda.py 2>&1 | tail -30 > "$OUT/test_cuda.txt"
echo "cuda tests exit ${PIPESTATUS[0]}" | tee -a "$LOG"; tail -3 "$OUT/test_cuda.txt" | tee -a "$LOG"

step bench-engine --batch qwen3-8b
timeout ${BENCH_TIMEOUT:-165} python3 -m ddtree_bench bench-engine --shape qwen3-8b --device cuda --dtype bfloat16 \
  --batch 1,2,4,8,16 --budgets 16,32,64,128 --prefix-len 1024 --rounds ${ROUNDS:-8} --tau "$PAPER_TAU" \
  --out "$OUT/bench_batch_qwen3-8b.json" 2> >(stamp > "$OUT/bench_batch_qwen3-8b.log") | grep -v '^{' > "$OUT/bench_batch_qwen3-8b.txt"
echo "bench exit ${PIPESTATUS[0]}" | tee -a "$LOG"
step done
