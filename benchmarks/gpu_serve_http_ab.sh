#!/usr/bin/env bash
# Two copies of the package behind the same `serve` command, through HTTP, in turn (A, B, A, B, ...): did a code
# change move what a user of the server sees? Through HTTP one code's TPOT spreads 10-40% from server to server on
# host-bound rounds (the GIL traffic between the engine thread and the server's event loop; docs/gpu-performance.md
# "Evening (H200, 2026-12-04)"), so two runs a side decide nothing: this runs ROUNDS (6) servers a side, alternating,
# and prints per run the median TPOT, TTFT, end-to-end ms and output tok/s (summary.json), then per side the
# median and range of the runs' TPOTs, B / A over the medians, whether every request's output ids matched
# between the sides (greedy: they must, unless the change meant to change them), and a paired sign-flip test over the
# rounds (serve_ab_summary.py: p < 0.05 is a difference beyond the spread of one code, which through HTTP reached
# 5-12% between medians of 5-6 servers a side on host-bound AR rounds; 6 rounds are the fewest that can reach it). CODE_A (default the repo) and
# CODE_B (required): folders holding a `ddtree_bench` package, put first on PYTHONPATH with PYTHONSAFEPATH=1 and
# checked to be the package that runs (serve_lib.sh `use_package`; each side's folder is printed); MODEL (toy), METHOD (ar),
# BUDGET (16), MAX_BATCH (1), LIMIT (16 prompts of gsm8k), NEW (256 tokens), DTYPE (float32), DEVICE (cuda; cpu
# for a smoke run, no graphs), TIME_S (unset; else no round starts that would end past TIME_S s from the start:
# the rounds that ran are summarised).
# A copy at another revision: benchmarks/ab_copy.sh (make it here, fill it on the device).
# Run from the repo root:  OUT=/tmp/ab CODE_B=/tmp/old METHOD=ar MAX_BATCH=4 bash benchmarks/gpu_serve_http_ab.sh
set -u
source "$(dirname "$0")/serve_lib.sh"
OUT=${OUT:?set OUT}; CODE_B=${CODE_B:?set CODE_B to the other copy}; mkdir -p "$OUT"
A=$(use_package "${CODE_A:-.}") || exit 1; CODE_B=$(use_package "$CODE_B") || exit 1
echo "A runs $A/ddtree_bench; B runs $CODE_B/ddtree_bench"
DEV=${DEVICE:-cuda}; M=${METHOD:-ar}
GRAPHS=(); [ "${DEV#cuda}" != "$DEV" ] && GRAPHS=(--cuda-graphs)
t0=$(date +%s); last=0; ran=0
for i in $(seq 1 "${ROUNDS:-6}"); do
  if ! room_for_another "$t0" "$last"; then
    echo "TIME_S=$TIME_S: stopping after $ran of ${ROUNDS:-6} rounds (another would end past it)"; break
  fi
  ts=$(date +%s)
  for side in A B; do
    code=$A; [ $side = B ] && code=$CODE_B
    d="$OUT/$side-$i"; mkdir -p "$d"
    PYTHONPATH="$code" python3 -m ddtree_bench serve --model "${MODEL:-toy}" --method "$M" --budget "${BUDGET:-16}" \
      --device "$DEV" --dtype "${DTYPE:-float32}" "${GRAPHS[@]}" --max-batch "${MAX_BATCH:-1}" --port 0 > "$d/serve.log" 2>&1 &
    srv=$!
    if ! port=$(wait_ready "$d/serve.log" "$srv"); then
      echo "server $side-$i did not come up:"; tail -5 "$d/serve.log"; kill "$srv" 2> /dev/null; exit 1
    fi
    PYTHONPATH="$code" python3 -m ddtree_bench run --backend standalone --url "http://127.0.0.1:$port" --model "${MODEL:-toy}" \
      --method "$M" --budget "${BUDGET:-16}" --suite gsm8k --limit "${LIMIT:-16}" --max-new-tokens "${NEW:-256}" \
      --concurrency 1 --warmup 2 --out "$d/run" -q > "$d/run.log" 2>&1 \
      || { echo "run $side-$i failed, stopping (the rounds after it would fail alike):"; tail -3 "$d/run.log"
           kill "$srv"; wait "$srv" 2> /dev/null; exit 1; }
    kill "$srv"; wait "$srv" 2> /dev/null
  done
  last=$(( $(date +%s) - ts )); ran=$i
done
[ "$ran" -ge 1 ] || { echo "no round ran (TIME_S=${TIME_S:-})"; exit 1; }
python3 "$(dirname "$0")/serve_ab_summary.py" "$OUT" "$ran"
