#!/usr/bin/env bash
# Issue 35 item 4 (the single loop's per-round overhead at B = 255 / 256, 5.0-5.3% of the round, is mostly the
# grid-keys tree build), one device call: the tree kernels' GPU tests (the grid builds against the PyTorch builder
# and the heap, and at the probe's widths at the Qwen3 vocabulary, B = 256 / 512), the build probe
# (benchmarks/gpu_probe_build.py: every builder's replay time and kernel table; the grid build at 8 / 16 / 32 rows
# a counting program and at the column widths and one-reduction loops of its WIDTHS, each checked equal to the
# PyTorch builder), then bench-engine's rounds at BUDGETS (255,256) on the Qwen3-8B shape with the overhead column,
# the baseline any faster build is read against (a build's saving is the round's: the build runs between the draft
# and the verify). PROBE_BUDGETS (64 256 512), BUDGETS (255,256) and TAU (their paper tau, for the cost model's
# lines) move the points. Last, whole rounds in one process (benchmarks/gpu_batch_ab.py, batch 1) at B = 255 / 256 with
# the default widths against WIDE arms set through the A/B knobs (DDTREE_GRID_KEYS_BJ, DDTREE_GRID_LEX_BJ, the
# grid-once feature): what a width the probe favours buys a round. AB=0 leaves it out.
# Files under $OUT: session.txt, tests.txt, probe.txt, probe.log, bench.{json,txt,log}, ab.txt (8: what a device call returns).
# Run from the repo root:  OUT=/tmp/out bash benchmarks/gpu_tree_build.sh
source "$(dirname "$0")/gpu_lib.sh"
step gpu tests
timeout ${TESTS_TIMEOUT:-120} python3 -m pytest -p no:cacheprovider -m gpu -q -rf \
  tests/engine/gpu/test_tree_kernels_triton.py -k "probe_widths or (heap and grid)" > "$OUT/tests.txt" 2>&1
echo "pytest exit $?: $(tail -1 "$OUT/tests.txt")" | tee -a "$LOG"
step probe
timeout ${PROBE_TIMEOUT:-270} python3 benchmarks/gpu_probe_build.py ${PROBE_BUDGETS:-64 256 512} \
  > "$OUT/probe.txt" 2> "$OUT/probe.log"
echo "probe exit $?" | tee -a "$LOG"
step bench
timeout ${BENCH_TIMEOUT:-150} python3 -m ddtree_bench bench-engine --shape qwen3-8b --device cuda --dtype bfloat16 \
  --budgets ${BUDGETS:-255,256} --prefix-len 1024 --rounds 10 --no-plain --no-build-table --verify-tokens 1 \
  --tau ${TAU:-255:10.4,256:10.4} \
  --out "$OUT/bench.json" 2> "$OUT/bench.log" | grep -v '^{' > "$OUT/bench.txt"
echo "bench exit ${PIPESTATUS[0]}" | tee -a "$LOG"
if [ "${AB:-1}" = 1 ]; then
  step round ab
  timeout ${AB_TIMEOUT:-150} python3 benchmarks/gpu_batch_ab.py --points ddtree:255,ddtree:256 --batches 1 \
    --arm default \
    --arm "w1024 DDTREE_GRID_KEYS_BJ=1024 DDTREE_GRID_LEX_BJ=256 DDTREE_GPU_EXPERIMENTAL=grid-once" \
    --arm "w512 DDTREE_GRID_KEYS_BJ=512 DDTREE_GRID_LEX_BJ=128 DDTREE_GPU_EXPERIMENTAL=grid-once" \
    > "$OUT/ab.txt" 2>&1
  echo "ab exit $?" | tee -a "$LOG"
fi
step done
