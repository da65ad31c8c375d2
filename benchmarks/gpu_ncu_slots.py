#!/usr/bin/env python3
"""The tree attention of one slot against C slots (the batched loop's verify, kernels/tree_attention.py) on the 8B
shape (32 query / 8 KV heads, head dim 128, bf16, a 1024-token prefix per slot in a 2048-slot cache): why a round of
two costs more attention than a round of one (docs/gpu-performance.md, Known gaps: 0.567 against 0.414 ms a forward
for DFlash on the H200), kernel by kernel.

Per (C, n): a forward's worth of tree_attend calls (36 layers, each its own K/V, so no layer reads another's from L2)
captured in one CUDA graph and timed over replays (graphs.replay_ms: median ms a forward, and per slot), then, with --ncu, one layer's
launches again between cudaProfilerStart / Stop so `ncu --profile-from-start off` sees the tree kernel and its
combine of that (C, n) only:

    python3 benchmarks/gpu_ncu_slots.py --slots 1,2 --tokens 17,65
    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section LaunchStats \\
        --section Occupancy --section WarpStateStats python3 benchmarks/gpu_ncu_slots.py --slots 2 --tokens 17 --ncu

Trees: the static builder's over random draft logits (x3: wide, as bench-engine's curve), one per slot, compiled at
the slot's prefix by compile_trees as the batched loop compiles them. Needs CUDA (exit 2 without). Knows nothing of
the GEMMs or the layer ops around the attention.
"""

from __future__ import annotations

import argparse
import sys

import torch

LAYERS, HQ, HKV, D, CAP, L = 36, 32, 8, 128, 2048, 15


def case(C: int, n: int, prefix: int, dev):
    """q [C, Hq, n, D], per-layer k / v [C, Hkv, CAP, D], and the trees' path, pos, start (compile_trees')."""
    from ddtree_bench.engine.gpu.kernels.tree_verify import compile_trees
    from ddtree_bench.engine.tree_vector import StaticTreeBuilder

    g = torch.Generator(device=dev).manual_seed(C * 1000 + n)
    rnd = lambda *s: torch.randn(*s, generator=g, device=dev, dtype=torch.bfloat16)  # noqa: E731
    q = rnd(C, HQ, n, D)
    kv = [(rnd(C, HKV, CAP, D), rnd(C, HKV, CAP, D)) for _ in range(LAYERS)]
    trees = [StaticTreeBuilder(L, 4096, n - 1, dev)(torch.randn(L, 4096, generator=torch.Generator().manual_seed(n + c))
                                                      .to(dev) * 3) for c in range(C)]
    tok, par, dep = (torch.stack([t[i] for t in trees]) for i in range(3))
    start = torch.full((C,), prefix, dtype=torch.long, device=dev)
    _, pos, _, _, path = compile_trees(torch.zeros(C, dtype=torch.long, device=dev), tok, par, dep, start, CAP,
                                       torch.bfloat16, HQ // HKV, L)
    return q, kv, path, pos, start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slots", default="1,2", help="slot counts C")
    ap.add_argument("--tokens", default="17,65", help="tree tokens n a slot (root included)")
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--ncu", action="store_true", help="one layer's launches inside cudaProfilerStart / Stop")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_ncu_slots: needs CUDA", file=sys.stderr)
        return 2
    from ddtree_bench.engine.gpu.graphs import replay_ms
    from ddtree_bench.engine.gpu.kernels.tree_attention import config, ranges_for, tree_attend

    dev = torch.device("cuda")
    print(f"gpu_ncu_slots: {torch.cuda.get_device_name()}, prefix {a.prefix}, {LAYERS} layers a forward")
    print("   C     n  rows  ranges  block_n  ms a forward  ms a slot  x one slot")
    one: dict[int, float] = {}
    for n in (int(x) for x in a.tokens.split(",")):
        for C in (int(x) for x in a.slots.split(",")):
            q, kv, path, pos, start = case(C, n, a.prefix, dev)
            with torch.inference_mode():
                med = replay_ms(lambda: [tree_attend(q, k, v, path, pos, start) for k, v in kv], reps=a.reps)
                if a.ncu:
                    torch.cuda.cudart().cudaProfilerStart()
                    tree_attend(q, kv[0][0], kv[0][1], path, pos, start)
                    torch.cuda.synchronize()
                    torch.cuda.cudart().cudaProfilerStop()
            M = HQ // HKV * n
            cfg = config(M, torch.bfloat16, dev)
            if C == 1:
                one[n] = med
            ratio = f"{med / one[n]:10.3f}" if n in one else "         -"
            print(f"{C:4d} {n:5d} {M:5d} {ranges_for(cfg, C, HKV, M, CAP):7d} {cfg.block_n:8d} {med:13.3f} "
                  f"{med / C:10.3f} {ratio}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
