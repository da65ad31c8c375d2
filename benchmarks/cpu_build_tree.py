"""CPU tree build vs budget at Qwen3's vocabulary (V = 151,936, L = 15): the paper's Algorithm 1 written
plainly (`perf.plain_tree`: a Python heap over torch.topk of log_softmax, ties in whatever order topk
leaves them, then the O(B^2) row-copy visibility matrix) against the engine's CPU build
(`build_tree_fast` on a CPU = `tree_cpu.build_tree_cpu`: the heap over lazily loaded exact top ranks,
vectorised `ancestor_matrix` for +vis). `--all` adds two history columns: the first vectorised build
(`SortedTreeBuilder`, a stable sort of the vocabulary) and the previous CPU build (exact top K at all
15 depths, then the heap); both run at the caller's thread count and take seconds per call there.

Two logit sets: "flat" (randn * 3: top-1 probability ~4%, the heap reads 3-4 depths, wide and shallow)
and "peaked" (a randn * 2 tail plus 16 boosted tokens per depth, top-1 probability 0.5-0.8 as a
trained drafter's: the heap reads 9-15 depths); "wide" on request (randn * 20: rows spanning ~170
nats, where torch.exp, inside the exact normaliser, takes its slow path). Fairness on a shared machine: the builders' order
rotates every rep, and every timed call has the same preamble, so none always runs after another's
parallel work: "idle" (SETTLE_S of sleep, so the OpenMP workers of the last parallel op have
stopped spinning) or "forward" (a FORWARD_N x FORWARD_N matmul at the caller's thread count right
before, as the engine builds a tree right after the drafter's forward; its workers still spin during
the build). Median of REPS, wall ms and the process's CPU ms (every thread's, spinning included).
Prints one table per (logits, preamble), then one JSON document.

    python benchmarks/cpu_build_tree.py [--reps 7] [--threads 1] [--v 151936] [--logits flat,peaked]
                                        [--before idle,forward] [--all]
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import time

import torch

from ddtree_bench.engine.tree import _heap_tree, ancestor_matrix, build_tree_fast
from ddtree_bench.engine.tree_vector import SortedTreeBuilder, exact_topk_logprobs
from ddtree_bench.perf.plain_tree import plain_algorithm1

L = 15
BUDGETS = [64, 128, 256, 512, 1024]
SETTLE_S = 0.02      # "idle": libgomp's workers spin a few ms after a parallel region, then sleep
FORWARD_N = 384      # "forward": a matmul of this side at the caller's threads, about one drafter layer's work


def sorted_build(logits, budget, visibility):
    tok, par, dep = SortedTreeBuilder(*logits.shape, budget, "cpu")(logits)
    if visibility:
        ancestor_matrix(par, int(dep.max()))


def previous_build(logits, budget, visibility):
    tree = _heap_tree(*exact_topk_logprobs(logits, min(budget, logits.shape[1])), budget)
    if visibility:
        ancestor_matrix(tree.parents, int(tree.depths.max()))


def new_build(logits, budget, visibility):
    tree = build_tree_fast(logits, budget)
    if visibility:
        ancestor_matrix(tree.parents, int(tree.depths.max()))


def make_logits(kind: str, V: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if kind == "flat":
        return torch.randn(L, V, generator=g) * 3
    if kind == "peaked":
        logits = torch.randn(L, V, generator=g) * 2
        ids = torch.randperm(V, generator=g)[: L * 16].view(L, 16)
        return logits.scatter_add_(1, ids, torch.linspace(14, 4, 16).expand(L, 16).contiguous())
    if kind == "wide":      # randn * 20: rows span ~170 nats, so exp(x - max) underflows for most tokens
        return torch.randn(L, V, generator=g) * 20
    raise SystemExit(f"unknown logits {kind!r}: flat | peaked | wide")


def table(logits, builders, reps, before, matrix):
    rows = []
    names = list(builders)
    for B in BUDGETS:
        wall: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        for fn in builders.values():           # warmup
            fn(logits, B, False)
        for rep in range(reps):
            order = names[rep % len(names):] + names[: rep % len(names)]
            for vis in (False, True):
                for name in order:
                    if before == "idle":
                        time.sleep(SETTLE_S)
                    else:
                        matrix @ matrix
                    key = name + ("+vis" if vis else "")
                    t, c = time.perf_counter(), time.process_time()
                    builders[name](logits, B, vis)
                    cpu.setdefault(key, []).append((time.process_time() - c) * 1e3)
                    wall.setdefault(key, []).append((time.perf_counter() - t) * 1e3)
        row = {"budget": B, **{k: round(statistics.median(v), 2) for k, v in wall.items()}}
        row["plain/new"] = round(row["plain"] / row["new"], 2)
        row["plain+vis/new+vis"] = round(row["plain+vis"] / row["new+vis"], 2)
        cpu_med = {k: statistics.median(v) for k, v in cpu.items()}
        row["cpu plain/new"] = round(cpu_med["plain"] / cpu_med["new"], 2)
        row["cpu new ms"] = round(cpu_med["new"], 2)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--v", type=int, default=151936)
    ap.add_argument("--logits", default="flat,peaked")
    ap.add_argument("--before", default="idle,forward")
    ap.add_argument("--all", action="store_true", help="also the sorted and previous builds (history; slow)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    builders = {"plain": plain_algorithm1, "new": new_build}
    if args.all:
        builders.update({"sorted": sorted_build, "previous": previous_build})
    matrix = torch.randn(FORWARD_N, FORWARD_N)
    load_start, t_start = os.getloadavg()[0], time.time()
    tables = []
    for kind in args.logits.split(","):
        logits = make_logits(kind, args.v)
        for before in args.before.split(","):
            load0 = os.getloadavg()[0]
            rows = table(logits, builders, args.reps, before, matrix)
            tables.append({"logits": kind, "before": before, "load_avg_1m": [round(load0, 1), round(os.getloadavg()[0], 1)],
                           "ms_median": rows})
            cols = list(rows[0])
            print(f"\n{kind} logits, before each call: {before}; {args.threads} torch thread(s), load {load0:.1f} -> "
                  f"{os.getloadavg()[0]:.1f}")
            print(" ".join(f"{c:>17}" for c in cols))
            for row in rows:
                print(" ".join(f"{row[c]:>17}" for c in cols))
    print(json.dumps({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "machine": platform.platform(),
                      "nproc": os.cpu_count(), "threads": args.threads, "torch": torch.__version__, "V": args.v, "L": L,
                      "reps": args.reps, "load_avg_1m": [round(load_start, 1), round(os.getloadavg()[0], 1)],
                      "seconds": round(time.time() - t_start), "tables": tables}))


if __name__ == "__main__":
    main()
