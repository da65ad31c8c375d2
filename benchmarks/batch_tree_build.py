"""Prints ms per batched tree build on a GPU (CUDA-graph replays, medians): C slots' trees from bf16
draft logits [C, 15, 151936] (the Qwen3 vocabulary) per budget, three ways - the per-slot PyTorch
builder C times (what the batched fast loop ran before), `BatchTreeBuilder` with the torch top-K
selection, and with the Triton selection (its CUDA default). Writes the table and JSON to --out.
Run: python benchmarks/batch_tree_build.py --out DIR (needs CUDA)."""

from __future__ import annotations

import argparse
import json
import pathlib

import torch

from ddtree_bench.engine.gpu.batch_tree import BatchTreeBuilder
from ddtree_bench.engine.gpu.graphs import replay_ms
from ddtree_bench.engine.tree_vector import StaticTreeBuilder


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--budgets", default="16,32,64,128")
    a = ap.parse_args()
    L, V = 15, 151_936
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for budget in [int(x) for x in a.budgets.split(",")]:
        one = StaticTreeBuilder(L, V, budget, "cuda")
        bt = BatchTreeBuilder(L, V, budget, "cuda", select="torch")
        bx = BatchTreeBuilder(L, V, budget, "cuda", select="triton")
        for C in [int(x) for x in a.batches.split(",")]:
            x = (torch.randn(C, L, V, device="cuda", generator=g) * 3).to(torch.bfloat16)
            row = {"batch": C, "budget": budget,
                   "per_slot_ms": replay_ms(lambda: [one(x[c]) for c in range(C)]),
                   "batched_torch_ms": replay_ms(lambda: bt(x)),
                   "batched_triton_ms": replay_ms(lambda: bx(x))}
            rows.append(row)
            print(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "batch_tree_build.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "L": L, "V": V,
                                                             "dtype": "bfloat16", "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
