#!/usr/bin/env bash
# One device call for issue 19 on the GPU path, inside a 240 s limit (each step has its own timeout; the
# last gets what is left). In order:
# 1. bench-engine --batch on the Qwen3-8B shape (random bf16 weights, 1024-token prompts, tau supplied from
#    the paper's curve as bench-engine does at batch 1): per (batch, budget) stage medians, the cold first
#    round of each new (bucket, budget) shape, output tok/s, and the batched cost model's predictions
#    (leave one batch out) beside the measured grid;
# 2. tests/engine/gpu/test_batch_tree_cuda.py: the batched tree build equals the per-slot builder on V = 151,936;
# 3. benchmarks/batch_tree_build.py: ms per batched build (per-slot / batched torch / batched Triton select);
# 4. tests/engine/gpu/test_batch_loop_cuda.py: the batched fast loop with graphs against batch 1.
# Files under $OUT: session.txt, bench_batch_qwen3-8b.{json,csv,txt,log}, test_tree_cuda.txt,
# batch_tree_build.{txt,json}, test_cuda.txt.
# Run from the repo root: OUT=/tmp/out bash benchmarks/gpu_batch.sh
set -u
OUT=${OUT:-/tmp/ddtree-gpu}; mkdir -p "$OUT"
export PYTHONPATH=.:tests${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
LOG="$OUT/session.txt"
T0=$SECONDS; LIMIT=${LIMIT:-232}
step() { echo "== $* ($(date -u +%FT%T.%3NZ), +$((SECONDS - T0)) s)" | tee -a "$LOG"; }
stamp() { while IFS= read -r l; do echo "$(date -u +%T.%3N) $l"; done; }
left() { echo $((LIMIT - (SECONDS - T0))); }
PAPER_TAU=16:8.6,32:9.3,64:9.75,128:10.2

step env
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"; } 2>&1 | tee -a "$LOG"

step bench-engine --batch qwen3-8b
timeout ${BENCH_TIMEOUT:-85} python3 -m ddtree_bench bench-engine --shape qwen3-8b --device cuda --dtype bfloat16 \
  --batch 1,2,4,8,16 --budgets 16,32,64,128 --prefix-len 1024 --rounds ${ROUNDS:-8} --tau "$PAPER_TAU" \
  --out "$OUT/bench_batch_qwen3-8b.json" 2> >(stamp > "$OUT/bench_batch_qwen3-8b.log") | grep -v '^{' > "$OUT/bench_batch_qwen3-8b.txt"
echo "bench exit ${PIPESTATUS[0]}" | tee -a "$LOG"

step batched tree build tests
timeout ${TREE_TIMEOUT:-40} python3 -m pytest -q -p no:cacheprovider tests/engine/gpu/test_batch_tree_cuda.py > "$OUT/test_tree_cuda.txt" 2>&1
echo "tree tests exit $?" | tee -a "$LOG"; tail -3 "$OUT/test_tree_cuda.txt" | tee -a "$LOG"

step batched tree build timing
timeout ${BUILD_TIMEOUT:-35} python3 benchmarks/batch_tree_build.py --out "$OUT" > "$OUT/batch_tree_build.txt" 2>&1
echo "build bench exit $?" | tee -a "$LOG"

step batch loop cuda tests
timeout $(left) python3 -m pytest -q -p no:cacheprovider tests/engine/gpu/test_batch_loop_cuda.py > "$OUT/test_cuda.txt" 2>&1
echo "cuda tests exit $?" | tee -a "$LOG"; tail -3 "$OUT/test_cuda.txt" | tee -a "$LOG"
step done
