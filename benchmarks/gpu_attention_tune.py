"""The verify's attention alone on the Qwen3-8B shape, per tree size and tree shape: the live-slot kernel and the tree
kernel swept over their launch shapes, the fastest of each beside what forward.py's auto rule runs, in one compact
table per tree shape, and a verdict line saying what auto would gain where a swept launch beats it.

Timed (ms per forward: 36 layers, each its own K/V so nothing stays in L2 that a real forward would not keep):
* sdpa: SDPA over the whole cache (forward.grouped_attend, the twin);
* live: kernels/attention.py's live-slot kernel (bias over the tree triangle) at every row block it takes
  (attention.BLOCK_MS, up to the rows' power of two) x slot ranges (LIVE_SPLITS and n_split's own count, used
  as given, plus n_split's count as live_attend picks it: "auto", capped at the live length with
  DDTREE_GPU_EXPERIMENTAL=split-cap), combine as a second launch; the fastest then once more folded into the
  one launch. Only where it can matter: M = 4n <= 2 x AUTO_MAX_ROWS;
* tree: kernels/tree_attention.py at every shape in SHAPES (config()'s bands, a narrow dense tile, and
  WIDE_SHAPES: 64/128-row tiles, Hopper's wgmma size), each gathered / dense, combine after / folded, with
  n_split's prefix ranges; the wide shapes also at TREE_SPLITS fixed prefix ranges (a 128-row tile leaves few
  programs, so more ranges fill the SMs, at the price of more fp32 partials);
* auto: forward._attend's rule with the fused ops (tree_attention.wanted, attention.wanted) and default shapes.
`err` is the largest difference from SDPA over every launch timed.

Runtime estimate on an H200 (default n = 1,16,64,128,256,512,1024, two tree shapes): 8 / 24 / 33 / 32 / 31 live
launches at n = 1 / 16 / 64 / 128 / 256 (none above), 50 tree launches at every n and 2 more (sdpa, auto): ~490
launches per tree shape, ~980 in all. Each is timed by graphs.replay_ms (2 eager calls, one capture, 3 + 10
replays) plus one eager call for `err`: 13 replays of 0.3-5 ms and 4 Python-driven passes of ~10 ms, so
~0.05-0.1 s a launch, ~1.5 min; plus ~100 kernel variants to compile on a cold Triton cache (~1-2 s each), so
~3-5 min in all. `--shapes picked` times only auto's own choices (seconds).

Trees are DDTree-shaped: the PyTorch builder's tree of the n - 1 most probable prefixes of random draft
logits (L = 15, V = 4096, logits x scale: 3 gives wide trees of depth <= 4, 12 the deep narrow trees of a
confident drafter), so depths stay <= 15 as in a real round. Needs CUDA; one run covers both tree shapes:
    python benchmarks/gpu_attention_tune.py [--prefix 1024] [--scales 3,12] [--shapes all|picked] [--out FILE.json]
`--out` writes every timing, each n's fastest live and tree launch (rows, splits, fold / the Config and
splits) and auto's, so winners can be applied as constants.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace

import torch

from ddtree_bench.engine.gpu.forward import grouped_attend
from ddtree_bench.engine.gpu.graphs import replay_ms
from ddtree_bench.engine.gpu.kernels import attention as live
from ddtree_bench.engine.gpu.kernels import tree_attention as tree
from ddtree_bench.engine.gpu.kernels.common import _pow2
from ddtree_bench.engine.gpu.kernels.tree_verify import compile_tree
from ddtree_bench.engine.tree_vector import StaticTreeBuilder

LAYERS, HQ, HKV, D, L = 36, 32, 8, 128, 15
# config()'s four bands before 2026-12-02, a narrower tree tile for the dense phase on small trees, and the wide (wgmma-sized) tiles
SHAPES = [tree.Config(16, 64, 4, 2), tree.Config(16, 128, 4, 2), tree.Config(32, 64, 4, 2), tree.Config(64, 64, 4, 3),
          tree.Config(16, 32, 4, 2), *tree.WIDE_SHAPES]
TREE_VARIANTS = {"gather": dict(tree_dense=False, fold=False), "gather1": dict(tree_dense=False, fold=True),
                 "dense": dict(tree_dense=True, fold=False), "dense1": dict(tree_dense=True, fold=True)}
TREE_SPLITS = (1, 2, 4)          # fixed prefix ranges the wide tiles are also timed at (gather and dense)
LIVE_SPLITS = (1, 2, 4, 8, 16, 32)
GAIN_MIN = 0.02                  # the verdict names an n where the best launch beats auto by more than this share


def graph_ms(fn, reps: int = 10) -> float:
    """Median ms of CUDA-graph replays of fn (the engine's own timer)."""
    return replay_ms(fn, reps=reps)


def shape_name(c: tree.Config, splits: int | None = None) -> str:
    kind = ("d" if c.tree_dense else "g") + ("f" if c.fold else "")
    ranges = splits or c.ranges
    return f"{c.block_m}x{c.block_n}w{c.warps}s{c.stages}{kind}" + (f"/{ranges}" if ranges else "")


def live_name(rows: int, splits: int | None, fold: bool) -> str:
    return f"{rows}r/{splits or 'auto'}{'f' if fold else ''}"


def tree_for(n: int, scale: float, dev) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if n == 1:
        e = torch.empty(0, dtype=torch.long, device=dev)
        return e, e, e
    logits = torch.randn(L, 4096, generator=torch.Generator().manual_seed(n)).to(dev) * scale
    return StaticTreeBuilder(L, 4096, n - 1, dev)(logits)


def tree_launches(M: int, dt, picked: bool) -> list[tuple[tree.Config, int | None]]:
    """(Config, fixed prefix ranges or None for n_split's) to time for M folded rows."""
    if picked:
        return [(tree.config(M, dt, "cuda"), None)]
    out = [(replace(c, **opts), None) for c in SHAPES for opts in TREE_VARIANTS.values()]
    out += [(replace(c, tree_dense=dense), s) for c in tree.WIDE_SHAPES for dense in (False, True) for s in TREE_SPLITS]
    return out


def live_launches(M: int, cap: int, picked: bool) -> list[tuple[int, int | None]]:
    """(rows per program, fixed ranges or None for n_split's count) to time for M folded rows. n_split's count is
    capped at the live length only with DDTREE_GPU_EXPERIMENTAL=split-cap; the capped counts of the 8B bench shape
    (16 at n = 16, 4 at n = 64) are among the fixed LIVE_SPLITS either way, beside the uncapped one."""
    if picked:
        return [(live.block_m(M), None)]
    out = []
    for r in (r for r in live.BLOCK_MS if r <= max(16, _pow2(M))):
        uncapped = live.n_split(HKV, M, cap, r)   # what auto runs without "split-cap", as fixed ranges
        splits = sorted({uncapped, *(s for s in LIVE_SPLITS if s <= -(-cap // live.BLOCK_N))})
        out += [(r, None)] + [(r, s) for s in splits]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--tokens", default="1,16,64,128,256,512,1024")
    ap.add_argument("--scales", default="3,12", help="draft logits x each: 3 = wide trees, 12 = deep trees")
    ap.add_argument("--shapes", default="all", help="all (the sweeps) | picked (only what auto picks: seconds)")
    ap.add_argument("--out", default="", help="write every timing and each n's winners as JSON")
    a = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    picked = a.shapes == "picked"
    ns = [int(x) for x in a.tokens.split(",")]
    cap = -(-(a.prefix + max(ns)) // 64) * 64
    gen = torch.Generator(device=dev).manual_seed(0)
    ks = [torch.randn(HKV, cap, D, device=dev, dtype=dt, generator=gen) for _ in range(LAYERS)]
    vs = [torch.randn(HKV, cap, D, device=dev, dtype=dt, generator=gen) for _ in range(LAYERS)]
    start = torch.tensor(a.prefix, device=dev)
    rows = []
    for scale in (float(x) for x in a.scales.split(",")):
        print(f"# logits x {scale:g} ({'wide' if scale <= 3 else 'deep'} trees), prefix {a.prefix}, {cap}-slot cache, "
              f"ms per forward ({LAYERS} layers); live [rows/ranges(f: folded)], tree [MxN warps stages g|d(f)/ranges]",
              flush=True)
        print(f"{'n':>5} {'depth':>5} {'sdpa':>6} {'auto':>6} {'auto runs':<22} {'best live':>20} {'best tree':>24} "
              f"{'gain':>6}  err", flush=True)
        gains = []
        for n in ns:
            tok, par, dep = tree_for(n, scale, dev)
            ids, pos, anc, bias, path = compile_tree(torch.zeros(1, dtype=torch.long, device=dev), tok, par, dep, start,
                                                     cap, dt, HQ // HKV, L)
            q = torch.randn(HQ, n, D, device=dev, dtype=dt, generator=gen)
            live_n = start + n
            M = HQ // HKV * n
            ref = grouped_attend(q, ks[0], vs[0], bias).float()
            row = {"scale": scale, "n": n, "M": M, "max_depth": int(dep.max()) if n > 1 else 0, "live": [], "tree": []}
            err = 0.0

            def run(fn) -> float | None:
                nonlocal err
                try:
                    ms = graph_ms(lambda: [fn(k, v) for k, v in zip(ks, vs)])
                except Exception as e:  # a shape the GPU cannot run (resources): say so, keep going
                    row.setdefault("failed", []).append(type(e).__name__)
                    return None
                err = max(err, float((fn(ks[0], vs[0]).float() - ref).abs().max()))
                return ms

            row["sdpa_ms"] = run(lambda k, v: grouped_attend(q, k, v, bias))
            if M <= 2 * live.AUTO_MAX_ROWS:
                for r, s in live_launches(M, cap, picked):
                    ms = run(lambda k, v, r=r, s=s: live.live_attend(q, k, v, bias, live_n, start, splits=s, fold=False,
                                                                     rows=r))
                    if ms is not None:
                        row["live"].append({"rows": r, "splits": s, "fold": False, "ms": ms})
                if row["live"]:
                    b = min(row["live"], key=lambda x: x["ms"])
                    ms = run(lambda k, v: live.live_attend(q, k, v, bias, live_n, start, splits=b["splits"], fold=True,
                                                           rows=b["rows"]))
                    if ms is not None:
                        row["live"].append({**b, "fold": True, "ms": ms})
            for c, s in tree_launches(M, dt, picked):
                ms = run(lambda k, v, c=c, s=s: tree.tree_attend(q, k, v, path, pos, start, splits=s, launch=c))
                if ms is not None:
                    row["tree"].append({"config": asdict(c), "splits": s, "ms": ms, "name": shape_name(c, s)})
            if tree.wanted(q, ks[0]):   # forward._attend's auto rule with the fused ops and the path table
                auto = (f"tree {shape_name(tree.config(M, dt, q.device))}",
                        lambda k, v: tree.tree_attend(q, k, v, path, pos, start))
            elif live.wanted(q, ks[0]):
                r = live.block_m(M)
                ns_auto = live.n_split(HKV, M, cap, r)
                auto = (f"live {r}r/{live.ranges_used(ns_auto, M, a.prefix + n)} of {ns_auto}",
                        lambda k, v: live.live_attend(q, k, v, bias, live_n, start))
            else:
                auto = ("sdpa", lambda k, v: grouped_attend(q, k, v, bias))
            row["auto_runs"], row["auto_ms"] = auto[0], run(auto[1])
            row["err"] = err
            bl = min(row["live"], key=lambda x: x["ms"]) if row["live"] else None
            bt = min(row["tree"], key=lambda x: x["ms"]) if row["tree"] else None
            row["live_best"], row["tree_best"] = bl, bt
            best = min([x["ms"] for x in (bl, bt) if x] + [row["sdpa_ms"] or float("inf")])
            row["gain_ms"] = (row["auto_ms"] - best) if row["auto_ms"] is not None else None
            if row["gain_ms"] is not None and row["gain_ms"] > GAIN_MIN * row["auto_ms"]:
                winner = ("sdpa" if best == row["sdpa_ms"] else
                          f"live {live_name(bl['rows'], bl['splits'], bl['fold'])}" if bl and best == bl["ms"] else
                          f"tree {bt['name']}")
                gains.append(f"{row['gain_ms']:.2f} ms at n={n} ({winner})")
            rows.append(row)
            fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
            lcell = f"{bl['ms']:.3f} [{live_name(bl['rows'], bl['splits'], bl['fold'])}]" if bl else "-"
            tcell = f"{bt['ms']:.3f} [{bt['name']}]" if bt else "-"
            print(f"{n:5d} {row['max_depth']:5d} {fmt(row['sdpa_ms']):>6} {fmt(row['auto_ms']):>6} {row['auto_runs']:<22} "
                  f"{lcell:>20} {tcell:>24} {fmt(row['gain_ms']):>6}  {err:.1e}"
                  + (f"  failed: {len(row['failed'])} launches ({', '.join(sorted(set(row['failed'])))})"
                     if "failed" in row else ""), flush=True)
        print(f"verdict (logits x {scale:g}): " + ("auto would gain " + "; ".join(gains) if gains else
                                                   f"auto is within {GAIN_MIN:.0%} of the best launch at every n"),
              flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"prefix": a.prefix, "capacity": cap, "rows": rows, "device": torch.cuda.get_device_name()}, f,
                      indent=1)


if __name__ == "__main__":
    main()
