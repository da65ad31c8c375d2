"""The verify's attention alone on the Qwen3-8B shape, per tree size: SDPA over the whole cache, the live-slot
kernel (bias over the tree triangle) and the tree kernel (prefix dense, ancestors gathered) at several launch
shapes. Prints ms per forward (36 layers, each its own K/V so nothing stays in L2 that a real forward would
not keep), the launch shape tree_attention.config picks, and each kernel's max error against SDPA.

Trees are DDTree-shaped: the PyTorch builder's tree of the n - 1 most probable prefixes of random draft
logits (L = 15, V = 4096, logits * --logit-scale: 3 gives wide trees of depth <= 4, larger scales the deep
narrow trees of a confident drafter), so depths stay <= 15 as in a real round. Needs CUDA:
    python benchmarks/gpu_attention_tune.py [--prefix 1024] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from ddtree_bench.engine.gpu.forward import grouped_attend
from ddtree_bench.engine.gpu.graphs import replay_ms
from ddtree_bench.engine.gpu.kernels import attention as live
from ddtree_bench.engine.gpu.kernels import tree_attention as tree
from ddtree_bench.engine.gpu.kernels.tree_verify import compile_tree
from ddtree_bench.engine.tree_vector import StaticTreeBuilder

LAYERS, HQ, HKV, D, L = 36, 32, 8, 128, 15
SHAPES = [tree.Config(16, 64, 4, 2), tree.Config(16, 64, 4, 2, True), tree.Config(32, 64, 4, 2),
          tree.Config(32, 64, 4, 2, True), tree.Config(16, 128, 4, 2), tree.Config(64, 64, 4, 3),
          tree.Config(64, 64, 4, 3, True), tree.Config(64, 64, 4, 4, True), tree.Config(64, 128, 4, 3, True),
          tree.Config(64, 64, 8, 3, True), tree.Config(128, 64, 8, 3, True), tree.Config(128, 128, 8, 3, True)]


def graph_ms(fn, reps: int = 20) -> float:
    """Median ms of CUDA-graph replays of fn (the engine's own timer)."""
    return replay_ms(fn, reps=reps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--tokens", default="1,16,64,128,256,512,1024")
    ap.add_argument("--out", default="")
    ap.add_argument("--logit-scale", type=float, default=3.0, help="draft logits x this: larger = deeper trees")
    ap.add_argument("--shapes", default="all", help="all | picked (only the launch shape config() picks)")
    a = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    ns = [int(x) for x in a.tokens.split(",")]
    cap = -(-(a.prefix + max(ns)) // 64) * 64
    gen = torch.Generator(device=dev).manual_seed(0)
    ks = [torch.randn(HKV, cap, D, device=dev, dtype=dt, generator=gen) for _ in range(LAYERS)]
    vs = [torch.randn(HKV, cap, D, device=dev, dtype=dt, generator=gen) for _ in range(LAYERS)]
    start = torch.tensor(a.prefix, device=dev)
    rows = []
    for n in ns:
        if n == 1:
            par = dep = tok = torch.empty(0, dtype=torch.long, device=dev)
        else:
            logits = torch.randn(L, 4096, generator=torch.Generator().manual_seed(n)).to(dev) * a.logit_scale
            tok, par, dep = StaticTreeBuilder(L, 4096, n - 1, dev)(logits)
        ids, pos, anc, bias, path = compile_tree(torch.zeros(1, dtype=torch.long, device=dev), tok, par, dep, start,
                                                 cap, dt, HQ // HKV, L)
        q = torch.randn(HQ, n, D, device=dev, dtype=dt, generator=gen)
        live_n = start + n
        ref = grouped_attend(q, ks[0], vs[0], bias)
        row = {"n": n, "max_depth": int(dep.max()) if n > 1 else 0, "picked": tree.config(HQ // HKV * n, dt).__dict__}
        row["sdpa_whole_ms"] = graph_ms(lambda: [grouped_attend(q, k, v, bias) for k, v in zip(ks, vs)])
        row["live_ms"] = graph_ms(lambda: [live.live_attend(q, k, v, bias, live_n, start) for k, v in zip(ks, vs)])
        row["live_err"] = float((live.live_attend(q, ks[0], vs[0], bias, live_n, start).float() - ref.float()).abs().max())
        row["tree_auto_ms"] = graph_ms(lambda: [tree.tree_attend(q, k, v, path, pos, start) for k, v in zip(ks, vs)])
        row["tree_err"] = float((tree.tree_attend(q, ks[0], vs[0], path, pos, start).float() - ref.float()).abs().max())
        for c in (SHAPES if a.shapes == "all" else [tree.config(HQ // HKV * n, dt)]):
            key = f"tree_{c.block_m}x{c.block_n}w{c.warps}s{c.stages}{'r' if c.k_rows else ''}_ms"
            try:
                row[key] = graph_ms(lambda c=c: [tree.tree_attend(q, k, v, path, pos, start, launch=c)
                                                 for k, v in zip(ks, vs)])
            except Exception as e:  # a shape the GPU cannot run (resources): say so, keep going
                row[key] = f"{type(e).__name__}"
        rows.append(row)
        shapes = {k: v for k, v in row.items() if k.startswith("tree_") and k.endswith("_ms") and k != "tree_auto_ms"}
        best = min((v, k) for k, v in shapes.items() if isinstance(v, float))
        print(f"n={n:5d} depth<={row['max_depth']:2d}  sdpa_whole {row['sdpa_whole_ms']:.3f}  live {row['live_ms']:.3f}"
              f"  tree(auto {row['picked']['block_m']}x{row['picked']['block_n']}) {row['tree_auto_ms']:.3f}"
              f"  best {best[1]} {best[0]:.3f}  err live {row['live_err']:.2e} tree {row['tree_err']:.2e}", flush=True)
        print("        " + "  ".join(f"{k[5:-3]} {v:.3f}" if isinstance(v, float) else f"{k[5:-3]} {v}"
                                     for k, v in shapes.items()), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"prefix": a.prefix, "capacity": cap, "rows": rows, "device": torch.cuda.get_device_name()}, f, indent=1)


if __name__ == "__main__":
    main()
