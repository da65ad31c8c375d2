"""CPU tree build vs budget at Qwen3's vocabulary (V = 151,936, L = 15): the paper's Algorithm 1 written
plainly (`perf.plain_tree`: a Python heap over torch.topk of log_softmax, ties in whatever order topk
leaves them, then the O(B^2) row-copy visibility matrix), the engine's first vectorised build
(`SortedTreeBuilder`: a stable sort of the whole vocabulary, a B x K candidate matrix per depth), the
previous CPU build (`exact_topk_logprobs` for all 15 depths at K, then the heap) and the current one
(`build_tree_fast` on a CPU = `tree_cpu.build_tree_cpu`: the heap over lazily loaded exact top
ranks), with and without the visibility matrix (vectorised `ancestor_matrix` for the engine's).
Every builder runs once per rep in turn (interleaved, so load drifts hit all alike); median of REPS,
wall time and this thread's CPU time (less sensitive to a loaded machine). Prints a table, then one
JSON document. Run: python benchmarks/cpu_build_tree.py [REPS] [V] [THREADS]"""

import datetime
import json
import os
import platform
import statistics
import sys
import time

import torch

from ddtree_bench.engine.tree import _heap_tree, ancestor_matrix, build_tree_fast
from ddtree_bench.engine.tree_vector import SortedTreeBuilder, exact_topk_logprobs
from ddtree_bench.perf.plain_tree import plain_algorithm1


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


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    V = int(sys.argv[2]) if len(sys.argv) > 2 else 151936
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    L, budgets = 15, [64, 128, 256, 512, 1024]
    torch.set_num_threads(threads)
    logits = torch.randn(L, V, generator=torch.Generator().manual_seed(0)) * 3
    builders = {"plain": plain_algorithm1, "sorted": sorted_build, "previous": previous_build, "new": new_build}
    rows = []
    for B in budgets:
        wall: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        for name, fn in builders.items():           # warmup
            fn(logits, B, False)
        for _ in range(reps):
            for vis in (False, True):
                for name, fn in builders.items():
                    key = name + ("+vis" if vis else "")
                    t, c = time.perf_counter(), time.thread_time()
                    fn(logits, B, vis)
                    cpu.setdefault(key, []).append((time.thread_time() - c) * 1e3)
                    wall.setdefault(key, []).append((time.perf_counter() - t) * 1e3)
        row = {"budget": B, **{k: round(statistics.median(v), 2) for k, v in wall.items()}}
        row["plain/new"] = round(row["plain"] / row["new"], 2)
        row["plain+vis/new+vis"] = round(row["plain+vis"] / row["new+vis"], 2)
        cpu_med = {k: statistics.median(v) for k, v in cpu.items()}
        row["cpu plain/new"] = round(cpu_med["plain"] / cpu_med["new"], 2)
        row["cpu new ms"] = round(cpu_med["new"], 2)
        rows.append(row)
    cols = list(rows[0])
    print(" ".join(f"{c:>17}" for c in cols))
    for row in rows:
        print(" ".join(f"{row[c]:>17}" for c in cols))
    print(json.dumps({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "machine": platform.platform(),
                      "threads": threads, "torch": torch.__version__, "V": V, "L": L, "reps": reps,
                      "load_avg_1m": round(os.getloadavg()[0], 1), "ms_median": rows}))


if __name__ == "__main__":
    main()
