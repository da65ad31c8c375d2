"""GPU probe: where the tree kernel's time goes at n = 64-256 (the verify's 1.21-1.28x over its GEMM-only time).

The Qwen3-8B shape (32 query / 8 KV heads, D = 128, 36 layers each with its own K/V, 1024-token prefix, bf16),
DDTree-shaped trees (gpu_attention_tune.tree_for: wide x3 and deep x12 draft logits). Per n, ms per forward
(36 launches, CUDA-graph replays) of kernels/tree_attention.tree_attend:
* auto: config(M) as the forward runs it (prefix ranges + the tree phase's range, combine as a second launch),
  each row's visibility from the path table per key tile; words: the same with the visibility words made once per
  forward (vis_words, what forward.py passes since 2026-12-03); gather: config's shape with the tree phase gathered
  per depth step instead of dense tiles (config's choice above 1536 folded rows before 2026-12-03);
* no-prefix: the same rows with an empty prefix (prefix 0, the tree at slots 0..T-1): the tree phase alone, plus
  the partial stores and the combine;
* root-only: the prefix as auto, each row seeing only the root (depth 0 everywhere): the prefix phase plus one
  tree tile, i.e. auto less the tree phase's extra tiles;
* combine: attention.combine alone on auto's partials (its second launch);
* ranges r: auto's shape at r fixed prefix ranges (1 = no partials, no combine); fold: the combine inside the launch;
* sdpa-flash: F.scaled_dot_product_attention without a mask over prefix + n keys (the flash / cuDNN kernel: no
  tree, same FLOPs) - what a mature kernel takes for this much work, not a bound.
Needs CUDA. Run: python benchmarks/gpu_probe_tree_phase.py [--tokens 64,128,256] [--scales 3,12]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch
import torch.nn.functional as F

from ddtree_bench.engine.gpu.graphs import replay_ms
from ddtree_bench.engine.gpu.kernels import attention as live
from ddtree_bench.engine.gpu.kernels import tree_attention as tree
from ddtree_bench.engine.gpu.kernels.tree_verify import compile_tree
from gpu_attention_tune import D, HKV, HQ, L, LAYERS, tree_for


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--tokens", default="64,128,256,512,1024")
    ap.add_argument("--scales", default="3,12")
    a = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    ns = [int(x) for x in a.tokens.split(",")]
    cap = -(-(a.prefix + max(ns)) // 64) * 64
    gen = torch.Generator(device=dev).manual_seed(0)
    ks = [torch.randn(HKV, cap, D, device=dev, dtype=dt, generator=gen) for _ in range(LAYERS)]
    vs = [torch.randn(HKV, cap, D, device=dev, dtype=dt, generator=gen) for _ in range(LAYERS)]
    start, zero = torch.tensor(a.prefix, device=dev), torch.tensor(0, device=dev)
    cols = ["auto", "words", "gather", "no-prefix", "root-only", "combine", "ranges1", "ranges2", "ranges8", "fold", "sdpa-flash"]
    print(f"ms per forward ({LAYERS} layers), prefix {a.prefix}; auto = {{config}}")
    print(f"{'scale':>5} {'n':>5} {'M':>5} " + " ".join(f"{c:>10}" for c in cols) + "  config", flush=True)
    for scale in (float(x) for x in a.scales.split(",")):
        for n in ns:
            tok, par, dep = tree_for(n, scale, dev)
            _, pos, _, _, path = compile_tree(torch.zeros(1, dtype=torch.long, device=dev), tok, par, dep, start, cap,
                                              dt, HQ // HKV, L)
            q = torch.randn(HQ, n, D, device=dev, dtype=dt, generator=gen)
            M = HQ // HKV * n
            cfg = tree.config(M, dt, dev)   # the shape tree_attend launches on this card
            ns_auto = tree.ranges_for(cfg, 1, HKV, M, cap)
            root_pos = torch.full_like(pos, a.prefix)
            root_path = torch.zeros_like(path)
            pacc = torch.zeros((ns_auto + 1, HKV, M, D), dtype=torch.float32, device=dev)
            pm = torch.zeros((ns_auto + 1, HKV, M), dtype=torch.float32, device=dev)
            pl = torch.ones_like(pm)
            out = torch.empty((n, HQ * D), dtype=dt, device=dev)
            qf = q.view(HKV, HQ // HKV * n, D)[None]
            words = tree.vis_words(path, pos, start)
            runs = {
                "auto": lambda k, v: tree.tree_attend(q, k, v, path, pos, start),
                "words": lambda k, v: tree.tree_attend(q, k, v, path, pos, start, words=words),
                "gather": lambda k, v: tree.tree_attend(q, k, v, path, pos, start, launch=replace(cfg, tree_dense=False)),
                "no-prefix": lambda k, v: tree.tree_attend(q, k, v, path, pos - a.prefix, zero),
                "root-only": lambda k, v: tree.tree_attend(q, k, v, root_path, root_pos, start),
                "combine": lambda k, v: live.combine(pacc, pm, pl, out, start, M, n, HQ // HKV, ns_auto + 1, HKV,
                                                     t_major=True),
                "ranges1": lambda k, v: tree.tree_attend(q, k, v, path, pos, start, splits=1, launch=cfg),
                "ranges2": lambda k, v: tree.tree_attend(q, k, v, path, pos, start, splits=2, launch=cfg),
                "ranges8": lambda k, v: tree.tree_attend(q, k, v, path, pos, start, splits=8, launch=cfg),
                "fold": lambda k, v: tree.tree_attend(q, k, v, path, pos, start, launch=replace(cfg, fold=True)),
                "sdpa-flash": lambda k, v: F.scaled_dot_product_attention(qf, k[None, :, : a.prefix + n],
                                                                          v[None, :, : a.prefix + n]),
            }
            cells = []
            for c in cols:
                try:
                    cells.append(f"{replay_ms(lambda f=runs[c]: [f(k, v) for k, v in zip(ks, vs)]):10.3f}")
                except Exception as e:  # a launch this GPU cannot run: say so, keep going
                    cells.append(f"{type(e).__name__[:10]:>10}")
            print(f"{scale:5g} {n:5d} {M:5d} " + " ".join(cells)
                  + f"  {cfg.block_m}x{cfg.block_n}w{cfg.warps}s{cfg.stages} ranges {ns_auto}", flush=True)


if __name__ == "__main__":
    main()
