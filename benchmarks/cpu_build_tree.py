"""CPU tree build vs budget at Qwen3's vocabulary (V = 151,936, L = 15), one thread: the paper's Algorithm 1
written plainly (a Python heap over torch.topk of log_softmax, ties in whatever order topk leaves them,
then the O(B^2) row-copy visibility matrix), the engine's old vectorised build (`SortedTreeBuilder`: a
stable sort of the whole vocabulary, a B x K candidate matrix per depth) and the new one
(`build_tree_fast` on a CPU = `PrunedTreeBuilder`), with and without the visibility matrix.
Every builder runs once per rep in turn (interleaved, so load drifts hit all alike); median of REPS.
Prints a table, then one JSON document. Run: python benchmarks/cpu_build_tree.py [REPS] [V]"""

import datetime
import heapq
import json
import platform
import statistics
import sys
import time

import torch

from ddtree_bench.engine.tree import ancestor_matrix, ancestor_matrix_slow, build_tree_fast
from ddtree_bench.engine.tree_vector import SortedTreeBuilder


def plain_heap(logits: torch.Tensor, budget: int, visibility: bool):
    """Algorithm 1 as one would write it: topk per depth, a heap of (-score, depth, rank, parent)."""
    L, V = logits.shape
    K = min(budget, V)
    lp, tok = torch.topk(torch.log_softmax(logits.float(), dim=-1), K, dim=-1)
    lp, tok = lp.tolist(), tok.tolist()
    heap = [(-lp[0][0], 1, 0, 0, 0.0)]
    tokens, parents = [], []
    while heap and len(tokens) < budget:
        neg, d, r, parent, parent_score = heapq.heappop(heap)
        tokens.append(tok[d - 1][r])
        parents.append(parent)
        if r + 1 < K:
            heapq.heappush(heap, (-(parent_score + lp[d - 1][r + 1]), d, r + 1, parent, parent_score))
        if d < L:
            heapq.heappush(heap, (neg - lp[d][0], d + 1, 0, len(tokens), -neg))
    if visibility:
        ancestor_matrix_slow(torch.tensor(parents))
    return tokens


def old_build(logits, budget, visibility):
    tok, par, dep = SortedTreeBuilder(*logits.shape, budget, "cpu")(logits)
    if visibility:
        ancestor_matrix(par, int(dep.max()))


def new_build(logits, budget, visibility):
    tree = build_tree_fast(logits, budget)
    if visibility:
        ancestor_matrix(tree.parents, int(tree.depths.max()))


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    V = int(sys.argv[2]) if len(sys.argv) > 2 else 151936
    L, budgets = 15, [64, 128, 256, 512, 1024]
    torch.set_num_threads(1)
    logits = torch.randn(L, V, generator=torch.Generator().manual_seed(0)) * 3
    builders = {"plain_heap": plain_heap, "old": old_build, "new": new_build}
    rows = []
    for B in budgets:
        times: dict[str, list[float]] = {}
        for name, fn in builders.items():           # warmup (the new builder caches its constants per budget)
            fn(logits, B, False)
        for _ in range(reps):
            for vis in (False, True):
                for name, fn in builders.items():
                    t = time.perf_counter()
                    fn(logits, B, vis)
                    times.setdefault(name + ("+vis" if vis else ""), []).append((time.perf_counter() - t) * 1e3)
        row = {"budget": B, **{k: round(statistics.median(v), 2) for k, v in times.items()}}
        row["plain/new"] = round(row["plain_heap"] / row["new"], 2)
        row["plain+vis/new+vis"] = round(row["plain_heap+vis"] / row["new+vis"], 2)
        rows.append(row)
    cols = list(rows[0])
    print(" ".join(f"{c:>17}" for c in cols))
    for row in rows:
        print(" ".join(f"{row[c]:>17}" for c in cols))
    print(json.dumps({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "machine": platform.platform(),
                      "threads": 1, "torch": torch.__version__, "V": V, "L": L, "reps": reps,
                      "load_avg_1m": round(__import__("os").getloadavg()[0], 1), "ms_median": rows}))


if __name__ == "__main__":
    main()
