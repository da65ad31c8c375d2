#!/usr/bin/env bash
# One device call for issue 8 (GPU speed): environment, GPU equality tests, bench-engine on the
# Qwen3-8B shape (random bf16 weights) and on the bundled toy pair, and optional probes. Files under
# $OUT: session.txt (everything, progress lines timestamped), tests.txt, bench_{qwen3-8b,toy}.{json,txt},
# and probe.txt (PROBE=1, per-kernel probe), topk.txt (PROBE_TOPK=1, the three top-K selections),
# build.txt (PROBE_BUILD="64 128 256", per-kernel time of the tree builders),
# firstuse.txt (FIRSTUSE=1, a cProfile of a toy bench at one fresh budget). The device tool returns at
# most 8 files, so do not ask for all of them at once. SKIP_TESTS / SKIP_8B / SKIP_PAIR=1 leave parts
# out; TEST_FILES, BUDGETS8B, ARGS8B, ARGSTOY narrow them; the *_TIMEOUT variables bound each part
# (the tool's call is 10 minutes). ARGS8B defaults to --no-build-table (the table compiles every
# Triton builder at every budget; with it the 8B bench overran 300 s). On an H200 (2026-11-29, runs
# K and O; benchmarks/h200-2026-11-29g, -29h) the fast-path GPU tests took 135 s, the 8B bench with
# --no-plain 79-116 s, the toy bench at every budget with --no-plain 19 s; the whole tree-kernel
# test file takes over 230 s on a cold Triton cache (split it over calls by node id). Check that every kernel compiles first, without a GPU:
# PYTHONPATH=/tmp/tsite:. python benchmarks/triton_ptx_check.py. Run from the repo root:
#   OUT=/tmp/out bash benchmarks/gpu_session.sh
set -u
OUT=${OUT:-/tmp/ddtree-gpu}; mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
LOG="$OUT/session.txt"
step() { echo "== $* ($(date -u +%FT%TZ))" | tee -a "$LOG"; }
PAPER_TAU=16:8.6,32:9.3,64:9.75,128:10.2,256:10.4,512:10.73,1024:11.0   # DDTree paper Fig. 3 (Qwen3-8B, MATH-500), read off the plot

step env
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name())"
  git rev-parse HEAD 2>/dev/null; } 2>&1 | tee -a "$LOG"

if [ -z "${SKIP_TESTS:-}" ]; then
  step gpu tests
  timeout ${TESTS_TIMEOUT:-180} python3 -m pytest -p no:cacheprovider -m gpu -v -rA \
    ${TEST_FILES:-tests/engine/gpu} > "$OUT/tests.txt" 2>&1
  echo "pytest exit $?" | tee -a "$OUT/tests.txt" "$LOG"; tail -15 "$OUT/tests.txt" >> "$LOG"
fi

if [ -n "${PROBE_TOPK:-}" ]; then
  step top-K probe
  timeout ${PROBE_TIMEOUT:-90} python3 benchmarks/gpu_probe_topk.py > "$OUT/topk.txt" 2>&1; echo "top-K probe exit $?" | tee -a "$LOG"
fi

if [ -n "${PROBE_BUILD:-}" ]; then  # per-kernel time of the tree builders at PROBE_BUILD's budgets
  step build probe
  timeout ${PROBE_TIMEOUT:-120} python3 benchmarks/gpu_probe_build.py $PROBE_BUILD > "$OUT/build.txt" 2>&1; echo "build probe exit $?" | tee -a "$LOG"
fi

if [ -n "${FIRSTUSE:-}" ]; then  # where the first rounds at a new budget spend their time, on a cold Triton cache
  step first-use profile
  timeout ${FIRSTUSE_TIMEOUT:-150} python3 -m cProfile -o "$OUT/firstuse.prof" -m ddtree_bench bench-engine --model toy \
    --device cuda --budgets ${FIRSTUSE_BUDGET:-512} --rounds 3 --no-plain --no-e2e --verify-tokens 1 -q > /dev/null 2>&1
  echo "first-use exit $?" | tee -a "$LOG"
  python3 -c "import pstats,sys; p=pstats.Stats('$OUT/firstuse.prof', stream=sys.stdout); p.sort_stats('cumulative').print_stats(45); p.sort_stats('tottime').print_stats(25)" > "$OUT/firstuse.txt" 2>&1
  rm -f "$OUT/firstuse.prof"
fi

if [ -n "${PROBE:-}" ]; then
  step kernel probe
  timeout ${PROBE_TIMEOUT:-60} python3 benchmarks/gpu_probe_kernels.py > "$OUT/probe.txt" 2>&1; echo "probe exit $?" >> "$LOG"
fi

bench() {  # name, timeout, args...
  local name=$1 t=$2; shift 2
  step bench $name
  timeout $t python3 -m ddtree_bench bench-engine "$@" --out "$OUT/bench_$name.json" \
    2> >(while IFS= read -r l; do echo "$(date -u +%T) $l"; done >> "$LOG") | grep -v '^{' > "$OUT/bench_$name.txt"
  echo "bench $name exit ${PIPESTATUS[0]}" | tee -a "$LOG"
}
[ -n "${SKIP_8B:-}" ] || bench qwen3-8b ${BENCH8B_TIMEOUT:-220} --shape qwen3-8b --device cuda --dtype bfloat16 \
  --budgets ${BUDGETS8B:-16..1024} --prefix-len 1024 --rounds ${ROUNDS:-20} --tau "$PAPER_TAU" ${ARGS8B:---no-build-table}
[ -n "${SKIP_PAIR:-}" ] || bench toy ${BENCHTOY_TIMEOUT:-170} --model toy --device cuda --dtype float32 --budgets 16..1024 \
  --prefix-len 512 --rounds ${ROUNDS:-20} --limit ${LIMIT:-4} --max-new-tokens ${MAXNEW:-128} ${ARGSTOY:-}
step done
