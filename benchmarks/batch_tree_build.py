"""Prints ms per batched tree build on a GPU (CUDA-graph replays, medians): C slots' trees from bf16
draft logits [C, 15, 151936] (the Qwen3 vocabulary) per budget and batch, by every batched builder -
`BatchTreeBuilder` (the exact one, Triton top-K selection: the batched loop's fallback) and the slotted
Triton builds (kernels/tree_block.SlottedTreeBuilder, kernels/tree_grid.SlottedGridBuilder without and
with precomputed keys) - plus the single build of each Triton kernel at C = 1 (what the single loop runs).
A slotted build whose certificate failed on these logits is marked (its time still counts: the kernel
ran; the loop would redo that round). Each builder's compile happens before its timing (warm.warm, one
process), reported as `compile_s`. Writes the table and JSON to --out.
Run: python benchmarks/batch_tree_build.py --out DIR [--kernels block,grid,grid-keys] (needs CUDA)."""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import torch

from ddtree_bench.engine.gpu import builders
from ddtree_bench.engine.gpu.batch_tree import BatchTreeBuilder
from ddtree_bench.engine.gpu.graphs import replay_ms
from ddtree_bench.engine.gpu.kernels.warm import warm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--budgets", default="16,32,64,128,256,512,1024")
    ap.add_argument("--kernels", default="block,grid,grid-keys")
    ap.add_argument("--block-max", type=int, default=256, help="no one-block builds above this budget (compile time)")
    a = ap.parse_args()
    L, V = 15, 151_936
    batches = [int(x) for x in a.batches.split(",")]
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for budget in [int(x) for x in a.budgets.split(",")]:
        exact = BatchTreeBuilder(L, V, budget, "cuda", select="triton")
        made = {}
        for k in a.kernels.split(","):
            if k == "block" and budget > a.block_max:
                continue
            sb = builders.make_slotted(k, L, V, budget, "cuda", max(batches), exact=exact)
            x = torch.zeros(1, L, V, device="cuda", dtype=torch.bfloat16)
            t0 = time.perf_counter()
            warm(lambda: sb(x), "cuda")
            torch.cuda.synchronize()
            made[k] = (sb, time.perf_counter() - t0)
        for C in batches:
            x = (torch.randn(C, L, V, device="cuda", generator=g) * 3).to(torch.bfloat16)
            row = {"batch": C, "budget": budget, "exact_ms": replay_ms(lambda: exact(x))}
            for k, (sb, compile_s) in made.items():
                sb.flag.zero_()
                row[f"{k}_ms"] = replay_ms(lambda: sb(x))
                row[f"{k}_flag"] = int(sb.flag.item() != 0)
                row[f"{k}_compile_s"] = round(compile_s, 1)
            row["single_rule"] = builders.auto_kernel(budget)
            rows.append(row)
            print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "batch_tree_build.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "L": L, "V": V,
                                                             "dtype": "bfloat16", "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
