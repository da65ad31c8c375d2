"""GPU probe: where a tree build's time goes, per kernel, at the Qwen3 vocabulary (L = 15 draft
positions, V = 151,936, bf16 random logits as bench-engine's builder timing uses).

For each budget and each Triton builder (builders.KERNELS; the one-block kernel up to B = 256) it
prints the builder's replayed-graph time, the top-K alone (kernels/topk.py), and the kernels seen by
torch.profiler over 10 graph replays: name, launches per build, device ms per build. The gap
between the replay time and the summed kernel time is launch latency and idle SMs between
dependent launches. First the top-K's two selections at K = 16 / 32 / 64 (replay time). Then the
grid builders' replay time at 8 / 16 / 32 rows per counting program and at the column widths and
reductions of WIDTHS (each checked equal to the PyTorch builder; without precomputed keys only up to
the budget where builders.auto_kernel still picks that builder), with the kernel table of the
fastest of them, the top-K with both survivor merges, and the walk's argmax over the verify logits
([B+1, V] bf16).
Run: python benchmarks/gpu_probe_build.py [budgets...] (default 64 128 256)
"""

import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from ddtree_bench.engine.gpu import _probe, builders
from ddtree_bench.engine.gpu.graphs import replay_ms
from ddtree_bench.engine.gpu.kernels.argmax import argmax_rows
from ddtree_bench.engine.gpu.kernels.topk import topk_logprobs_fused
from ddtree_bench.engine.tree_vector import StaticTreeBuilder

dev = torch.device("cuda")
L, V = 15, 151936
REPS = 10
ROWS = (8, 16, 32)  # GridTreeBuilder rows per counting program, compared by replay time
# (columns a step of the counting loops, of the lex loop, one reduction after the loop), at 8 rows a program
WIDTHS = ((128, 64, True), (256, 64, False), (256, 64, True), (512, 128, False), (512, 128, True), (1024, 256, True),
          (2048, 256, True))


def kernel_table(fn):
    """{kernel name: (launches, device ms)} per call of fn, from REPS replays of its CUDA graph."""
    fn()
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPS):
            g.replay()
        torch.cuda.synchronize()
    acc = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if getattr(e, "device_type", None) is not None and str(e.device_type).endswith("CUDA"):
            t = getattr(e, "device_time", None)
            if t is None:
                t = getattr(e, "cuda_time", 0.0)
            acc[e.name][0] += 1
            acc[e.name][1] += t / 1000
    del g
    return {k: (n / REPS, ms / REPS) for k, (n, ms) in acc.items()}


def grid_point(B, x, ref, **knobs):
    """One grid builder at `knobs` (_probe.grid_builder's), checked equal to the PyTorch builder: (its replay ms, inf
    where its tree differs; its label; the builder)."""
    gb = _probe.grid_builder(L, V, B, dev, **knobs)
    same = all(torch.equal(a, b) for a, b in zip(gb(x), ref)) and gb.flag.item() == 0
    what = ", ".join(f"{k} = {v}" for k, v in knobs.items() if k != "keys_first")
    ms = replay_ms(lambda: gb(x))
    print(f"  {gb.name} {what}: replay {ms:.4f} ms{'' if same else ' (DIFFERS)'}", flush=True)
    return (ms if same else float("inf")), f"{gb.name} {what}", gb


def show(title, fn):
    total = replay_ms(fn)
    tab = kernel_table(fn)
    ksum = sum(ms for _, ms in tab.values())
    launches = sum(n for n, _ in tab.values())
    print(f"  {title}: replay {total:.4f} ms; {launches:.0f} kernels summing {ksum:.4f} ms; gaps {total - ksum:.4f} ms")
    for name, (n, ms) in sorted(tab.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"      {ms:8.4f} ms  x{n:<4.0f} {name[:90]}")


x = torch.randn(L, V, generator=torch.Generator().manual_seed(0)).to(dev, torch.bfloat16)
for k in (16, 32, 64):
    line = f"top-K at K = {k}:"
    for sel in ("min", "threshold"):
        line += f" {sel} {replay_ms(lambda: _probe.topk(x, k, select=sel)):.4f} ms"
    print(line, flush=True)

budgets = [int(a) for a in sys.argv[1:]] or [64, 128, 256]
for B in budgets:
    x = torch.randn(L, V, generator=torch.Generator().manual_seed(B)).to(dev, torch.bfloat16)
    print(f"B = {B}", flush=True)
    for kind in builders.KERNELS:
        if kind == "block" and B > 256:
            continue
        tb = builders.checked_builder(L, V, B, dev, kind)
        if tb is None:
            print(f"  {kind}: unusable here")
            continue
        show(f"{kind} (K = {tb.K}, N = {tb.N}{f', rows = {tb._rows}' if kind != 'block' else ''})", lambda: tb(x))
    ref = StaticTreeBuilder(L, V, B, dev)(x)
    points = []
    for keys in ((False, True) if B <= builders.AUTO_GRID_MAX_BUDGET else (True,)):   # what auto_kernel may pick
        for rows in ROWS:
            points.append(grid_point(B, x, ref, keys_first=keys, rows=rows))
        for bj, lex_bj, once in WIDTHS:
            points.append(grid_point(B, x, ref, keys_first=keys, bj=bj, lex_bj=lex_bj, once=once))
    _, what, best = min(points, key=lambda p: p[0])
    show(f"fastest grid point: {what}", lambda: best(x))
    show(f"top-K alone (K = {tb.K})", lambda: topk_logprobs_fused(x, tb.K))
    if tb.K > 32:
        show(f"top-K alone, torch merge (K = {tb.K})", lambda: _probe.topk(x, tb.K, merge="torch"))
    logits = torch.randn(B + 1, V, device=dev, dtype=torch.bfloat16)
    show(f"walk argmax over [{B + 1}, {V}] bf16", lambda: logits.argmax(dim=-1))
    same = torch.equal(argmax_rows(logits), logits.argmax(dim=-1))
    show(f"walk argmax, kernels/argmax.py{'' if same else ' (DIFFERS)'}", lambda: argmax_rows(logits))
    print(flush=True)
