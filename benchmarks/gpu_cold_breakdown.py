"""Where a process's first rounds spend their cold start, phase by phase, on a fresh Triton cache and then again on
the cache the first process left.

Each run is a child process on its own Triton cache. It times CUDA's start (context, first cuBLAS GEMM), the
random pair's construction, and then the first round of each point in order (AR first, as a sweep runs it), with
every phase of that round timed where it happens: the fused layer ops' self-test (`fused.self_test`) and its
concurrent compile (`fused.compile_self_test`), the tree kernels' self-test (`tree_kernels.self_test`), the weight
GEMMs' warm (`fused.warm_linears`), the tree builder's check (`builders.choose`), the prefill (the target's plain
forward) and each stage's capture (`graphs.Stage._capture`: two eager runs, then the graph). Every Triton compile
(`JITFunction._do_compile`: a compile, or a load from the disk cache) is counted with its seconds under the phase
it ran in; compiles on warm threads are counted where the warm was called, so their seconds can exceed the wall's,
and a tree builder's compiles on `builders.prefetched`'s thread under whatever phase the main thread is in then
(the self-tests' or the GEMM warm's): read the `bucket` row's wall for what they cost.

Runs, each on a fresh cache unless said: `prime` (as `before`; the first process after a machine starts pays for
reading libraries from disk, so its figures are not compared), `before` (the self-tests' kernels compiled one
after another as they run, launchers built at first launch: `fused.compile_self_test`, the tree self-test's warm and
`warm.PREPARE_LAUNCHERS` switched off), `fresh` (the code as it is), `again` (a second process on `fresh`'s cache:
what a later run of the same points pays), `noprefetch` (as `fresh` with `builders.PREFETCH` off: a budget's tree
builder compiled by its check, after the self-tests and the warms, not beside them), `noround` (`loop.WARM_ROUND`
off: the round's kernels compiled as the first round reaches them), `nowarm` (both off). (At b420fa7, which a call ran, the runs were `serial`: only compile_self_test
off; `launchers`: PREPARE_LAUNCHERS on, which was off by default; `grid16`: that, and the grid builder at B <= 32.)
Per phase also Triton's gcc builds (`triton.runtime.build._build`: its driver and launcher modules)
and first module loads with their launchers (`CompiledKernel._init_handles`). Prints a table per run and one JSON
line per run.

    python benchmarks/gpu_cold_breakdown.py --shape qwen3-8b --points ar,dflash,ddtree:16,ddtree:64
    python benchmarks/gpu_cold_breakdown.py --shape random --device cpu --dtype float32 --prefix-len 32   # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager


class Timeline:
    """Phases (nested names, wall seconds) and the Triton compiles inside each."""

    def __init__(self):
        self.stack: list[str] = []
        self.phases: dict[str, dict] = {}
        self.main = threading.get_ident()

    def _row(self, name: str) -> dict:
        return self.phases.setdefault(name, {"s": 0.0, "calls": 0, "compiles": 0, "compile_s": 0.0, "kernels": []})

    @contextmanager
    def phase(self, name: str, sync=None):
        full = "/".join(self.stack + [name])
        self.stack.append(name)
        if sync:
            sync()
        t = time.perf_counter()
        try:
            yield
        finally:
            if sync:
                sync()
            row = self._row(full)
            row["s"] += time.perf_counter() - t
            row["calls"] += 1
            self.stack.pop()

    def compiled(self, kernel: str, seconds: float) -> None:
        row = self._row("/".join(self.stack) or "(outside)")
        row["compiles"] += 1
        row["compile_s"] += seconds
        row["kernels"].append(f"{kernel} {seconds:.2f}")

    def tally(self, what: str, name: str, seconds: float) -> None:
        """A gcc build (Triton's launcher / driver modules) or a first module load + launcher (init)."""
        row = self._row("/".join(self.stack) or "(outside)")
        row[what] = row.get(what, 0) + 1
        row[what + "_s"] = row.get(what + "_s", 0.0) + seconds


def _wrap(owner, attr: str, tl: Timeline, name, sync=None):
    fn = getattr(owner, attr)

    def wrapped(*a, **k):
        with tl.phase(name(*a, **k) if callable(name) else name, sync):
            return fn(*a, **k)

    setattr(owner, attr, wrapped)


def _time_calls(owner, attr: str, record, when=lambda first: True) -> None:
    """owner.attr wrapped: record(its first argument, wall seconds) after each call for which when(first argument),
    asked before the call, holds. Triton's compile, gcc build and module load are counted this way."""
    fn = getattr(owner, attr)

    def wrapped(*args, **kw):
        go = when(args[0])
        t = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            if go:
                record(args[0], time.perf_counter() - t)

    setattr(owner, attr, wrapped)


def child(a) -> dict:
    t_proc = time.perf_counter()
    import random

    import torch
    from triton.runtime.jit import JITFunction

    tl = Timeline()
    cuda = a.device == "cuda"
    sync = torch.cuda.synchronize if cuda else None
    import triton.runtime.build as tbuild
    from triton.compiler.compiler import CompiledKernel

    if hasattr(JITFunction, "_do_compile"):
        _time_calls(JITFunction, "_do_compile", lambda fn, s: tl.compiled(getattr(fn, "__name__", "?"), s))
    _time_calls(tbuild, "_build", lambda name, s: tl.tally("gcc", name, s))
    if hasattr(CompiledKernel, "_init_handles"):   # timed only when it loads (the module not yet there)
        _time_calls(CompiledKernel, "_init_handles", lambda k, s: tl.tally("init", getattr(k, "name", "?"), s),
                    when=lambda k: getattr(k, "module", None) is None)

    from ddtree_bench.engine.generate import Engine
    from ddtree_bench.engine.gpu import builders, fused, graphs, tree_kernels
    from ddtree_bench.engine.gpu import loop as fast_loop
    from ddtree_bench.engine.gpu.loop import FastLoop
    from ddtree_bench.engine.loading import random_pair
    from ddtree_bench.perf.shapes import random_shaped_pair

    out: dict = {"run": a.child, "import_s": time.perf_counter() - t_proc}
    with tl.phase("cuda start", sync):
        x = torch.randn(64, 64, device=a.device, dtype=torch.bfloat16)
        (x @ x).sum().item()
    with tl.phase("pair", sync):
        if a.shape == "random":
            target, drafter = random_pair(seed=0, vocab_size=272, dtype=a.dtype, device=a.device)
        else:
            target, drafter = random_shaped_pair(a.shape, a.dtype, a.device)
    if a.child in ("before", "prime"):   # the cold-start code before 2026-12-03 night's changes
        from ddtree_bench.engine.gpu.kernels import warm

        fused.compile_self_test = lambda *args, **kw: 0
        tree_kernels.warm = lambda *args, **kw: 0
        warm.PREPARE_LAUNCHERS = False
    if a.child in ("noprefetch", "nowarm"):
        builders.PREFETCH = False
    if a.child in ("noround", "nowarm"):
        fast_loop.WARM_ROUND = False
    _wrap(fused, "compile_self_test", tl, "compile_self_test")
    _wrap(fused, "self_test", tl, "self_test", sync)
    _wrap(tree_kernels, "self_test", tl, "tree_self_test", sync)
    import ddtree_bench.engine.gpu.fused as fused_mod
    _wrap(fused_mod, "warm_linears", tl, "warm_linears", sync)
    _wrap(builders, "choose", tl, "builder", sync)
    _wrap(FastLoop, "_bucket", tl, "bucket", sync)
    _wrap(FastLoop, "_warm_round", tl, "warm_round", sync)
    _wrap(graphs.Stage, "_capture", tl, lambda self: f"capture {self.name}", sync)
    tforward = type(target).forward

    def prefill(self, *args, **kw):
        with tl.phase("prefill", sync):
            return tforward(self, *args, **kw)

    type(target).forward = prefill
    eng = Engine(target, drafter, cuda_graphs=True)
    loop = eng.fast_loop()
    prompt = [random.Random(0).randrange(target.cfg.vocab_size) for _ in range(a.prefix_len)]
    out["process"] = {k: v for k, v in tl.phases.items()}
    out["points"] = {}
    for point in a.points.split(","):
        method, _, budget = point.partition(":")
        budget = int(budget or 0)
        tl.phases = {}
        t = time.perf_counter()
        with tl.phase(point):
            eng.generate(prompt, method, budget, 8)
        out["points"][point] = {"cold_s": loop.cold_s[(method, budget)], "generate_s": time.perf_counter() - t,
                                "phases": tl.phases}
    return out


def show(r: dict) -> None:
    print(f"== run {r['run']}: import {r['import_s']:.1f} s; " + ", ".join(
        f"{k} {v['s']:.2f} s ({v['compiles']} compiles)" for k, v in r["process"].items()))
    for point, p in r["points"].items():
        print(f"-- {point}: first round {p['cold_s']:.2f} s (cold_s), generate {p['generate_s']:.2f} s")
        print(f"   {'phase':<44} {'wall s':>7} {'calls':>5} {'compiles':>8} {'compile s':>9} {'gcc':>4} {'gcc s':>6} "
              f"{'inits':>5} {'init s':>6}")
        for name, row in sorted(p["phases"].items()):
            print(f"   {name:<44} {row['s']:7.2f} {row['calls']:5d} {row['compiles']:8d} {row['compile_s']:9.2f} "
                  f"{row.get('gcc', 0):4d} {row.get('gcc_s', 0):6.2f} {row.get('init', 0):5d} {row.get('init_s', 0):6.2f}"
                  + (f"  {', '.join(sorted(row['kernels'], key=lambda k: -float(k.split()[-1])))}" if row["kernels"] else ""))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-8b", help="a perf/shapes.py shape, or random (the tiny random pair)")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only smoke-runs the script (no Triton there)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--points", default="ar,dflash,ddtree:16,ddtree:64")
    ap.add_argument("--runs", default="prime,before,fresh,again")
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(child(a)), flush=True)
        return 0
    caches: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="triton-cold-") as root:
        for run in a.runs.split(","):
            cache = caches["fresh"] if run == "again" else os.path.join(root, run)
            caches.setdefault(run, cache)
            env = dict(os.environ, TRITON_CACHE_DIR=cache, DDTREE_BENCH_CACHE_DIR=cache)
            cmd = [sys.executable, os.path.abspath(__file__), "--child", run, "--shape", a.shape, "--dtype", a.dtype, "--device", a.device,
                   "--points", a.points.split(",")[0] if run == "prime" else a.points, "--prefix-len", str(a.prefix_len)]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if p.returncode:
                print(p.stderr[-4000:], file=sys.stderr)
                return p.returncode
            r = json.loads(p.stdout.strip().splitlines()[-1])
            show(r)
            print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
