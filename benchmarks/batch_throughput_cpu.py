"""Output tok/s of the batched reference engine on the bundled toy pair on this CPU, per
method/budget and concurrency: the table of issue 19 (item 4, CPU half).

For each method (AR, DFlash, DDTree at each `--budgets` value) and each concurrency c (`--concurrency`,
default 1, 2, 4, 8) it runs the same N gsm8k prompts (chat-templated, greedy, `--max-new-tokens`
each) through the batched engine in-process (`engine.batch.BatchLoop`, max_batch = c, every request
queued at once, so continuous batching keeps c requests in flight until the queue drains). Each
configuration runs `--warmup` times unmeasured, then once measured.

Figures per cell (one `Cell` row of the CSV):

* output_tok_s = all requests' output tokens / wall time of the whole batch run;
* ratio_vs_ar = output_tok_s / AR's output_tok_s at the same c (summary.csv's
  `throughput_ratio_vs_ar`: the batched speedup);
* batch_fill_mean = mean over engine rounds of the requests in the round (AR fills to c; speculative
  requests retire at different rounds, so they fill less);
* tau = mean over requests of each request's mean acceptance length (bonus token included).

It prints the machine (nproc, torch threads, the 1-minute load average at start and end) and a
table, and writes the cells as CSV to `--out`. Nothing is asserted: speed figures belong here, not
in tests. On a loaded machine the absolute figures measure contention as much as the engine, and
cells measured minutes apart are not comparable; the load is printed so a reader can tell.

    python benchmarks/batch_throughput_cpu.py --out batch_throughput_cpu.csv \
        [--prompts 8] [--max-new-tokens 32] [--budgets 16,32,64] [--concurrency 1,2,4,8] [--threads 2]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class Cell:
    """One (method, budget, concurrency) measurement."""

    method: str
    budget: int | None
    concurrency: int
    prompts: int
    max_new_tokens: int
    output_tokens: int
    wall_s: float
    output_tok_s: float
    ratio_vs_ar: float | None
    batch_fill_mean: float | None
    batch_fill_max: int | None
    tau: float | None
    load_avg_1m_before: float
    load_avg_1m_after: float

    @property
    def label(self) -> str:
        return self.method + (f" B={self.budget}" if self.budget is not None else "")


def _ints(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"error: expected a comma list of integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise SystemExit(f"error: expected positive integers, got {text!r}")
    return vals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="CSV file to write (one row per cell)")
    ap.add_argument("--prompts", type=int, default=8, help="gsm8k prompts per run (>= the largest concurrency to fill it)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--budgets", default="16,32,64", help="DDTree budgets")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured runs per cell before the measured one")
    args = ap.parse_args()
    budgets, cs = _ints(args.budgets), _ints(args.concurrency)
    if args.prompts < 1 or args.max_new_tokens < 1 or args.threads < 1 or args.warmup < 0:
        raise SystemExit("error: --prompts, --max-new-tokens and --threads must be >= 1, --warmup >= 0")
    if args.out.parent and not args.out.parent.exists():
        raise SystemExit(f"error: --out {args.out}: no such directory {args.out.parent}")
    torch.set_num_threads(args.threads)

    from ddtree_bench.engine.batch import BatchRequest
    from ddtree_bench.pair import load_pair
    from ddtree_bench.suites.prompts import load_suite

    pair = load_pair("toy", None, "ddtree")
    prompts = load_suite("gsm8k", args.prompts).prompts
    ids = [pair.tokenizer.apply_chat_template([{"role": "user", "content": p.turns[0]}]) for p in prompts]
    configs: list[tuple[str, int | None]] = [("ar", None), ("dflash", None)] + [("ddtree", b) for b in budgets]

    def measure(method: str, budget: int | None, c: int) -> Cell:
        loop = pair.engine.batch_loop(method, budget or 0, c)
        reqs = [BatchRequest(p, args.max_new_tokens, stop_ids=pair.stop_ids) for p in ids]
        before = os.getloadavg()[0]
        t0 = time.perf_counter()
        gens = loop.run(reqs)
        wall_s = time.perf_counter() - t0
        toks = sum(len(g.output_ids) for g in gens)
        taus = [sum(g.accept_lengths) / len(g.accept_lengths) for g in gens if g.accept_lengths]
        return Cell(method, budget, c, len(ids), args.max_new_tokens, toks, wall_s, toks / wall_s, None,
                    loop.stats.mean_batch_size, loop.stats.max_batch_size, sum(taus) / len(taus) if taus else None,
                    before, os.getloadavg()[0])

    start_load = os.getloadavg()
    t_start = time.time()
    print(f"toy pair, fp32, CPU ({platform.processor() or platform.machine()}), nproc {os.cpu_count()}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; {len(ids)} gsm8k prompts x "
          f"{args.max_new_tokens} new tokens, greedy, all queued at once, max_batch = c")
    print(f"load average (1/5/15 min) at start: {start_load[0]:.2f} / {start_load[1]:.2f} / {start_load[2]:.2f}", flush=True)
    cells: dict[tuple[str, int | None, int], Cell] = {}
    for c in cs:
        for method, budget in configs:
            for _ in range(args.warmup):
                measure(method, budget, c)
            cell = cells[(method, budget, c)] = measure(method, budget, c)
            print(f"  {cell.label} c={c}: {cell.output_tok_s:.1f} tok/s, fill {cell.batch_fill_mean or 0:.1f}, "
                  f"{cell.wall_s:.1f} s, load {cell.load_avg_1m_after:.1f}", flush=True)
    for (method, budget, c), cell in cells.items():
        ar = cells.get(("ar", None, c))
        cell.ratio_vs_ar = cell.output_tok_s / ar.output_tok_s if ar is not None and ar.output_tok_s > 0 else None
    end_load = os.getloadavg()
    print(f"load average (1/5/15 min) at end: {end_load[0]:.2f} / {end_load[1]:.2f} / {end_load[2]:.2f}; "
          f"took {time.time() - t_start:.0f} s")

    print("| method | " + " | ".join(f"c={c} tok/s (x AR, fill)" for c in cs) + " | tau (first c) |")
    print("|" + "---|" * (len(cs) + 2))
    for method, budget in configs:
        row = [cells[(method, budget, c)] for c in cs]
        parts = [f"{x.output_tok_s:.1f} ({x.ratio_vs_ar:.2f}x, {x.batch_fill_mean or 0:.1f})" if x.ratio_vs_ar is not None
                 else f"{x.output_tok_s:.1f}" for x in row]
        tau = f"{row[0].tau:.2f}" if row[0].tau is not None else "-"
        print(f"| {row[0].label} | " + " | ".join(parts) + f" | {tau} |")
    fields = [f.name for f in dataclasses.fields(Cell)]
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for cell in cells.values():
            w.writerow(dataclasses.asdict(cell))
    print(f"csv: {args.out}")


if __name__ == "__main__":
    main()
