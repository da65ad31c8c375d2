#!/usr/bin/env bash
# One device call for issue 8 (GPU speed): environment, GPU equality tests, the SDPA probe, and
# bench-engine on the Qwen3-8B shape (random bf16 weights) and on the toy pair (random tiny pair if
# the toy weights are not there yet). Everything lands under $OUT. Run from the repo root:
#   OUT=/tmp/out bash benchmarks/gpu_session.sh
set -u
OUT=${OUT:-/tmp/ddtree-gpu}; mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
step() { echo "== $* ($(date -u +%FT%TZ))"; }
PAPER_TAU=16:8.6,32:9.3,64:9.75,128:10.2,256:10.4,512:10.73,1024:11.0   # DDTree paper Fig. 3 (Qwen3-8B, MATH-500), read off the plot

step env
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
python3 -c "import torch, typer, yaml, tqdm, safetensors, tokenizers, jinja2, aiohttp; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"

step gpu tests
timeout ${TESTS_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_fastpath.py 2>&1 | tail -25

if [ -n "${PROBE:-}" ]; then
  step sdpa probe
  timeout 90 python3 benchmarks/gpu_probe.py 2>&1 | tee "$OUT/probe.txt"
fi

step bench qwen3-8b
timeout ${BENCH8B_TIMEOUT:-330} python3 -m ddtree_bench bench-engine --shape qwen3-8b --device cuda --dtype bfloat16 \
  --budgets 16..1024 --prefix-len 1024 --rounds ${ROUNDS:-20} --tau "$PAPER_TAU" --out "$OUT/bench_qwen3-8b.json" \
  2> "$OUT/bench_qwen3-8b.err" | grep -v '^{' | tee "$OUT/bench_qwen3-8b.txt"
tail -3 "$OUT/bench_qwen3-8b.err"

if [ -n "${SKIP_PAIR:-}" ]; then step done; exit 0; fi
if [ -f ddtree_bench/models/toy/target/config.json ]; then PAIR=toy; else PAIR=random; fi
step bench $PAIR pair
timeout ${BENCHTOY_TIMEOUT:-200} python3 -m ddtree_bench bench-engine --model $PAIR --device cuda --dtype float32 \
  --budgets 16..1024 --prefix-len 512 --rounds ${ROUNDS:-20} --limit ${LIMIT:-4} --max-new-tokens ${MAXNEW:-128} --out "$OUT/bench_$PAIR.json" \
  2> "$OUT/bench_$PAIR.err" | grep -v '^{' | tee "$OUT/bench_$PAIR.txt"
tail -3 "$OUT/bench_$PAIR.err"
step done
