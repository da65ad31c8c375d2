"""The verify's attention alone on the Qwen3-8B shape, per tree size and tree shape: every attention variant at a
few launch shapes, and the one forward.py's auto rule picks, in one compact table per tree shape.

Variants (ms per forward: 36 layers, each its own K/V so nothing stays in L2 that a real forward would not keep):
* sdpa: SDPA over the whole cache (forward.grouped_attend, the twin);
* live / live1: the live-slot kernel (bias over the tree triangle), split-KV combined by a second launch / folded
  into the one launch (kernels/attention.py);
* gather / gather1: the tree kernel, prefix dense and each row's ancestors gathered; combine after / folded;
* dense / dense1: the tree kernel with the dense tree phase (masked tensor-core tiles over the tree's nodes);
* auto: what forward._attend's auto rule runs with the fused ops (tree_attention.wanted, attention.wanted).
The tree variants are timed at every shape in SHAPES and the fastest is printed with its shape
(block_m x block_n, warps, stages); `err` is the largest difference from SDPA over all variants.

Trees are DDTree-shaped: the PyTorch builder's tree of the n - 1 most probable prefixes of random draft
logits (L = 15, V = 4096, logits x scale: 3 gives wide trees of depth <= 4, 12 the deep narrow trees of a
confident drafter), so depths stay <= 15 as in a real round. Needs CUDA; one run covers both tree shapes:
    python benchmarks/gpu_attention_tune.py [--prefix 1024] [--scales 3,12] [--shapes all|picked] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import torch

from ddtree_bench.engine.gpu.forward import grouped_attend
from ddtree_bench.engine.gpu.graphs import replay_ms
from ddtree_bench.engine.gpu.kernels import attention as live
from ddtree_bench.engine.gpu.kernels import tree_attention as tree
from ddtree_bench.engine.gpu.kernels.tree_verify import compile_tree
from ddtree_bench.engine.tree_vector import StaticTreeBuilder

LAYERS, HQ, HKV, D, L = 36, 32, 8, 128, 15
# config()'s four bands, plus a narrower tree tile for the dense phase on small trees
SHAPES = [tree.Config(16, 64, 4, 2), tree.Config(16, 128, 4, 2), tree.Config(32, 64, 4, 2), tree.Config(64, 64, 4, 3),
          tree.Config(16, 32, 4, 2)]
TREE_VARIANTS = {"gather": dict(tree_dense=False, fold=False), "gather1": dict(tree_dense=False, fold=True),
                 "dense": dict(tree_dense=True, fold=False), "dense1": dict(tree_dense=True, fold=True)}


def graph_ms(fn, reps: int = 10) -> float:
    """Median ms of CUDA-graph replays of fn (the engine's own timer)."""
    return replay_ms(fn, reps=reps)


def shape_name(c: tree.Config) -> str:
    return f"{c.block_m}x{c.block_n}w{c.warps}s{c.stages}"


def tree_for(n: int, scale: float, dev) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if n == 1:
        e = torch.empty(0, dtype=torch.long, device=dev)
        return e, e, e
    logits = torch.randn(L, 4096, generator=torch.Generator().manual_seed(n)).to(dev) * scale
    return StaticTreeBuilder(L, 4096, n - 1, dev)(logits)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--tokens", default="1,16,64,128,256,512,1024")
    ap.add_argument("--scales", default="3,12", help="draft logits x each: 3 = wide trees, 12 = deep trees")
    ap.add_argument("--shapes", default="all", help="all (SHAPES) | picked (only the shape config() picks: faster)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    ns = [int(x) for x in a.tokens.split(",")]
    cap = -(-(a.prefix + max(ns)) // 64) * 64
    gen = torch.Generator(device=dev).manual_seed(0)
    ks = [torch.randn(HKV, cap, D, device=dev, dtype=dt, generator=gen) for _ in range(LAYERS)]
    vs = [torch.randn(HKV, cap, D, device=dev, dtype=dt, generator=gen) for _ in range(LAYERS)]
    start = torch.tensor(a.prefix, device=dev)
    rows = []
    cols = ["sdpa", "live", "live1", *TREE_VARIANTS, "auto"]
    for scale in (float(x) for x in a.scales.split(",")):
        print(f"# logits x {scale:g} ({'wide' if scale <= 3 else 'deep'} trees), prefix {a.prefix}, ms per forward "
              f"({LAYERS} layers); tree variants: fastest of {len(SHAPES) if a.shapes == 'all' else 1} shape(s) [shape]",
              flush=True)
        print(f"{'n':>5} {'depth':>5} " + " ".join(f"{c:>19}" for c in cols) + "  auto runs      best      err", flush=True)
        for n in ns:
            tok, par, dep = tree_for(n, scale, dev)
            ids, pos, anc, bias, path = compile_tree(torch.zeros(1, dtype=torch.long, device=dev), tok, par, dep, start,
                                                     cap, dt, HQ // HKV, L)
            q = torch.randn(HQ, n, D, device=dev, dtype=dt, generator=gen)
            live_n = start + n
            ref = grouped_attend(q, ks[0], vs[0], bias).float()
            row = {"scale": scale, "n": n, "max_depth": int(dep.max()) if n > 1 else 0, "ms": {}, "shape": {}}
            err = 0.0

            def run(name, fn, shape=None):
                nonlocal err
                try:
                    ms = graph_ms(lambda: [fn(k, v) for k, v in zip(ks, vs)])
                except Exception as e:  # a shape the GPU cannot run (resources): say so, keep going
                    row.setdefault("failed", {})[f"{name} {shape}"] = type(e).__name__
                    return
                err = max(err, float((fn(ks[0], vs[0]).float() - ref).abs().max()))
                if name not in row["ms"] or ms < row["ms"][name]:
                    row["ms"][name], row["shape"][name] = ms, shape

            run("sdpa", lambda k, v: grouped_attend(q, k, v, bias))
            run("live", lambda k, v: live.live_attend(q, k, v, bias, live_n, start, fold=False))
            run("live1", lambda k, v: live.live_attend(q, k, v, bias, live_n, start, fold=True))
            for name, opts in TREE_VARIANTS.items():
                for c in SHAPES if a.shapes == "all" else [tree.config(HQ // HKV * n, dt)]:
                    c = replace(c, **opts)
                    run(name, lambda k, v, c=c: tree.tree_attend(q, k, v, path, pos, start, launch=c), shape_name(c))
            if tree.wanted(q, ks[0]):   # forward._attend's auto rule with the fused ops and the path table
                auto = ("tree", lambda k, v: tree.tree_attend(q, k, v, path, pos, start))
            elif live.wanted(q, ks[0]):
                auto = ("live", lambda k, v: live.live_attend(q, k, v, bias, live_n, start))
            else:
                auto = ("sdpa", lambda k, v: grouped_attend(q, k, v, bias))
            run("auto", auto[1])
            row["auto_runs"] = auto[0] if auto[0] != "tree" else f"tree {shape_name(tree.config(HQ // HKV * n, dt))}"
            row["err"] = err
            row["best"] = min((ms, name) for name, ms in row["ms"].items() if name != "auto")[1]
            rows.append(row)
            cells = []
            for c in cols:
                ms, shape = row["ms"].get(c), row["shape"].get(c)
                cells.append(f"{'-' if ms is None else f'{ms:.3f}'}{f' [{shape}]' if shape else ''}".rjust(19))
            print(f"{n:5d} {row['max_depth']:5d} " + " ".join(cells) + f"  {row['auto_runs']:<14} {row['best']:<9} {err:.1e}"
                  + (f"  failed: {row['failed']}" if "failed" in row else ""), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"prefix": a.prefix, "capacity": cap, "rows": rows, "device": torch.cuda.get_device_name()}, f,
                      indent=1)


if __name__ == "__main__":
    main()
