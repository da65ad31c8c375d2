"""Output tok/s of the batched reference engine on the toy pair, per method/budget and concurrency.

For each method (AR, DFlash, DDTree B = 16, 32, 64) and each concurrency c (1, 2, 4, 8) it runs
the same N suite prompts (chat-templated, greedy, max_new_tokens each) through `BatchLoop` with
max_batch = c, every request queued at once, so continuous batching keeps c requests in flight
until the queue drains. tok/s = all output tokens / wall time of the whole batch run. The ratio
is tok/s / AR's tok/s at the same c (summary.csv's `throughput_ratio_vs_ar`). A warmup run per
configuration precedes the measured one. It prints a table; nothing is asserted (speed figures
belong here, not in tests).

    python benchmarks/batch_throughput.py [--prompts 8] [--max-new-tokens 48] [--threads 2]

The machine it ran on is part of the result: print `nproc` and the load beside the table.
"""

from __future__ import annotations

import argparse
import os
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--budgets", default="16,32,64")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from ddtree_bench.engine.batch import BatchRequest, batch_loop_for
    from ddtree_bench.pair import load_pair
    from ddtree_bench.suites.prompts import load_suite

    pair = load_pair("toy", None, "ddtree")
    prompts = load_suite("gsm8k", args.prompts).prompts
    ids = [pair.tokenizer.apply_chat_template([{"role": "user", "content": p.turns[0]}]) for p in prompts]
    configs = [("ar", 0), ("dflash", 0)] + [("ddtree", int(b)) for b in args.budgets.split(",")]
    cs = [int(c) for c in args.concurrency.split(",")]

    def run(method, budget, c):
        loop = batch_loop_for(pair.engine, method, budget, c)
        reqs = [BatchRequest(p, args.max_new_tokens, stop_ids=pair.stop_ids) for p in ids]
        t0 = time.perf_counter()
        gens = loop.run(reqs)
        dt = time.perf_counter() - t0
        toks = sum(len(g.output_ids) for g in gens)
        taus = [sum(g.accept_lengths) / len(g.accept_lengths) for g in gens if g.accept_lengths]
        return toks / dt, loop.stats.mean_batch_size or 0.0, sum(taus) / len(taus) if taus else 0.0

    print(f"toy pair, fp32, CPU, {torch.get_num_threads()} threads, nproc {os.cpu_count()}, "
          f"load {os.getloadavg()[0]:.2f} (1 min) at start; {len(ids)} gsm8k prompts x {args.max_new_tokens} new tokens, greedy")
    table: dict[tuple, tuple] = {}
    for c in cs:
        for method, budget in configs:
            run(method, budget, c)  # warmup
            table[(method, budget, c)] = run(method, budget, c)
    print(f"load {os.getloadavg()[0]:.2f} (1 min) at end")
    head = "| method | " + " | ".join(f"c={c} tok/s (x AR)" for c in cs) + " | tau |"
    print(head)
    print("|" + "---|" * (len(cs) + 2))
    for method, budget in configs:
        cells = []
        for c in cs:
            tps, fill, _ = table[(method, budget, c)]
            ar = table[("ar", 0, c)][0]
            cells.append(f"{tps:.0f} ({tps / ar:.2f}x, fill {fill:.1f})")
        name = method + (f" B={budget}" if method == "ddtree" else "")
        print(f"| {name} | " + " | ".join(cells) + f" | {table[(method, budget, cs[0])][2]:.2f} |")


if __name__ == "__main__":
    main()
