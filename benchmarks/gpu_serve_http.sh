#!/usr/bin/env bash
# `serve --max-batch N` against `serve --max-batch 1` at one request at a time, through HTTP, as a user meets it
# (issue 35, item 1): the real server (the embedded toy pair on CUDA, --cuda-graphs: the single fast loop at
# --max-batch 1, the batch scheduler over the batched fast loop above) and `ddtree-bench run --backend standalone
# --concurrency 1` against it, REPS times in turn (1, N, 1, N, ...) so a drifting GPU lands on both. Per run:
# output tok/s, median TPOT / TTFT / end-to-end ms and τ (summary.json); then N against 1 over the runs' medians
# and their best TPOT (one stalled run moves a median of two), and whether every request's output ids are the same
# under both (greedy: they must be). BUDGET (16), MAX_BATCH (4), METHOD (ddtree), LIMIT (16 prompts of gsm8k), NEW
# (256 tokens), REPS (2), DTYPE (float32), CONCURRENCY (1), DEVICE (cuda; cpu for a smoke run, no graphs), CODE
# (the folder whose ddtree_bench package runs, default the repo: an A/B against another copy of the package), TIME_S
# (unset; else no repetition starts that would end past TIME_S s from the start: the ones that ran are summarised).
# The summary ends with a paired sign-flip test over the repetitions (serve_ab_summary.py: p < 0.05 = beyond the spread).
# Run from the repo root:  OUT=/tmp/out bash benchmarks/gpu_serve_http.sh
set -u
source "$(dirname "$0")/serve_lib.sh"
OUT=${OUT:?set OUT}; mkdir -p "$OUT"
B=${BUDGET:-16}; N=${MAX_BATCH:-4}; M=${METHOD:-ddtree}; REPS=${REPS:-2}; DEV=${DEVICE:-cuda}
GRAPHS=(); [ "${DEV#cuda}" != "$DEV" ] && GRAPHS=(--cuda-graphs)
CODE=$(use_package "${CODE:-.}") || exit 1; echo "runs $CODE/ddtree_bench"
export PYTHONPATH=$CODE${PYTHONPATH:+:$PYTHONPATH}
t0=$(date +%s); last=0; ran=0
for r in $(seq 1 "$REPS"); do
  if ! room_for_another "$t0" "$last"; then
    echo "TIME_S=$TIME_S: stopping after $ran of $REPS repetitions (another would end past it)"; break
  fi
  ts=$(date +%s)
  for mb in 1 "$N"; do
    log="$OUT/serve-mb$mb-r$r.log"
    python3 -m ddtree_bench serve --model toy --method "$M" --budget "$B" --device "$DEV" --dtype "${DTYPE:-float32}" \
      "${GRAPHS[@]}" --max-batch "$mb" --port 0 > "$log" 2>&1 &
    srv=$!
    if ! port=$(wait_ready "$log" "$srv"); then
      echo "server (max-batch $mb) did not come up:"; tail -5 "$log"; kill "$srv" 2> /dev/null; exit 1
    fi
    python3 -m ddtree_bench run --backend standalone --url "http://127.0.0.1:$port" --model toy --method "$M" \
      --budget "$B" --suite gsm8k --limit "${LIMIT:-16}" --max-new-tokens "${NEW:-256}" \
      --concurrency "${CONCURRENCY:-1}" --warmup 2 --out "$OUT/mb$mb-r$r" -q \
      || { echo "run (max-batch $mb) failed ($?), stopping"; kill "$srv"; wait "$srv" 2> /dev/null; exit 1; }
    kill "$srv"; wait "$srv" 2> /dev/null
  done
  last=$(( $(date +%s) - ts )); ran=$r
done
[ "$ran" -ge 1 ] || { echo "no repetition ran (TIME_S=${TIME_S:-})"; exit 1; }
python3 - "$OUT" "$N" "$ran" "$(dirname "$0")" <<'EOF'
import importlib.util, json, math, statistics, sys
spec = importlib.util.spec_from_file_location("serve_ab_summary", f"{sys.argv[4]}/serve_ab_summary.py")
summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(summary)
sign_flip_p = summary.sign_flip_p
out, n, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def load(mb, r):
    d = f"{out}/mb{mb}-r{r}"
    s = json.load(open(f"{d}/summary.json"))
    recs = [json.loads(l) for l in open(f"{d}/records.jsonl")]
    return s, {(x["prompt_id"], x["turn"]): x["output_ids"] for x in recs}
rows, same = {}, True
print("run        tok/s   tpot ms  ttft ms   e2e ms    tau")
for r in range(1, reps + 1):
    for mb in ("1", n):
        s, ids = load(mb, r)
        med = lambda k: s[k]["p50"]
        rows.setdefault(mb, []).append((s["output_throughput_tok_s"], med("tpot_ms"), med("ttft_ms"), med("e2e_ms")))
        print(f"mb{mb:<3} r{r}  {s['output_throughput_tok_s']:7.1f}  {med('tpot_ms'):7.3f}  {med('ttft_ms'):7.2f}"
              f"  {med('e2e_ms'):7.1f}  {s['acceptance_length_mean']:5.2f}")
    same &= load("1", r)[1] == load(n, r)[1]
one, many = ({k: statistics.median(x[i] for x in rows[mb]) for i, k in enumerate(("tok_s", "tpot", "ttft", "e2e"))}
             for mb in ("1", n))
print(f"max-batch {n} / max-batch 1 (medians over {reps} runs each): tok/s {many['tok_s'] / one['tok_s']:.3f}x, "
      f"TPOT {many['tpot'] / one['tpot']:.3f}x, TTFT {many['ttft'] / one['ttft']:.3f}x, e2e {many['e2e'] / one['e2e']:.3f}x; "
      f"output ids {'identical' if same else 'DIFFER'} request by request")
lo = {mb: min(x[1] for x in rows[mb]) for mb in ("1", n)}   # the runs' best TPOT: robust to one stalled run
print(f"best TPOT over the runs: max-batch {n} {lo[n]:.3f} ms, max-batch 1 {lo['1']:.3f} ms ({lo[n] / lo['1']:.3f}x)")
logs = [math.log(b[1] / a[1]) for a, b in zip(rows["1"], rows[n])]   # repetition r ran 1 then N back to back
p = sign_flip_p(logs)
print(f"paired sign-flip test over {reps} repetitions: p = {p:.3f} ({'beyond' if p < 0.05 else 'within'} what one "
      f"server's repetitions spread; mean TPOT ratio {math.exp(sum(logs) / len(logs)):.3f}x)")
EOF
