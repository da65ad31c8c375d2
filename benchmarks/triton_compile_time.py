"""CPU seconds to compile the fast loop's tree builders per (builder, budget) for sm_90, on a machine without a GPU.

What it knows: which Triton kernel variants each builder (gpu/builders.make) launches at a budget, found
as the GPU would key its cache (kernels/variants.py: the builder runs on CPU tensors with its launches
recorded, each bound by Triton's own binder for CUDA: compile-time constants, integer specialisations,
launch options); each distinct variant compiled once to a cubin for GPUTarget("cuda", 90, 32) (Triton's
bundled ptxas) in a fresh Triton cache, timed in CPU seconds of this process and its ptxas children
(wall seconds mean little on a shared machine). What `builders.choose(kind="auto")` compiles at a budget
comes from builders.auto_kernel(budget) and the dtype its check builds in; before that rule (commit
2a154c2) auto compiled every Triton builder (the one-block one up to BLOCK_KERNEL_MAX_BUDGET = 256), in
fp32 for the check and in the rounds' dtype for the timing. The last column is what warm() waits for:
one thread per kernel function, each compiling its variants in turn, so the slowest function's sum.

--forward does the same for what a round launches besides the builder (perf/round_variants.py: the target
forward's layer ops, GEMMs and attention, the argmax, the tree compile / walk / commit) at each step of a
sweep: AR, DFlash, then the budgets in order. --gemm: the weight GEMM's variants per row count alone.

What it does not know: GPU-side costs (loading modules, Triton's C launchers, CUDA-graph capture), the
drafter's forward, and the H200 host's CPU speed (docs/gpu-performance.md, "Cold start", relates the two).
    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/triton_compile_time.py [--budgets 16,32,...]
        [--builders block,grid,grid-keys] [--shape qwen3-8b|toy] [--dtype bfloat16|float32] [--jobs 1]
        [--gemm | --forward [--prefix 1024] [--new-tokens 64]]
Prints, per budget, each builder's distinct variants and CPU seconds, what auto compiles there, and what
a sweep over the budgets in the given order compiles new at each (a variant shared with an earlier
budget is compiled once). --jobs N compiles N variants at once in forked processes (total wall only).
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import tempfile
import time

os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="ddtree-compile-time-")  # fresh: every compile is a miss

import torch  # noqa: E402
import triton  # noqa: E402

from ddtree_bench.engine.gpu import builders  # noqa: E402
from ddtree_bench.engine.gpu.kernels.variants import compile_variant, launched_variants  # noqa: E402
from ddtree_bench.perf.round_variants import h200_gemm_table, round_variants  # noqa: E402

SHAPES = {"qwen3-8b": (15, 151936), "toy": (15, 4096)}  # (L = block size - 1, V)


def builder_variants(kernel_name: str, L: int, V: int, budget: int, dtype: torch.dtype) -> dict:
    """key -> Variant of every distinct kernel builder `kernel_name` launches on [L, V] logits of dtype."""
    b = builders.make(kernel_name, L, V, budget, "cpu")
    logits = torch.randn(L, V, generator=torch.Generator().manual_seed(budget)).to(dtype)
    return launched_variants(lambda: b(logits))


_POOL_ITEMS: list = []


def _compile_item(i: int) -> tuple[float, float]:
    return compile_variant(_POOL_ITEMS[i])


def compile_all(items: dict, jobs: int) -> tuple[dict, float]:
    """key -> (CPU s, wall s) of compiling every variant (serial, or `jobs` forked processes at once), and
    the wall time of it all. Progress on stderr."""
    keys = list(items)
    t0 = time.perf_counter()
    if jobs <= 1:
        secs = []
        for i, k in enumerate(keys):
            secs.append(compile_variant(items[k]))
            print(f"  [{i + 1}/{len(keys)}] {k[1]} {secs[-1][0]:.1f} s CPU", file=sys.stderr, flush=True)
    else:
        import multiprocessing as mp

        _POOL_ITEMS[:] = [items[k] for k in keys]
        with mp.get_context("fork").Pool(jobs) as pool:
            secs = pool.map(_compile_item, range(len(keys)), chunksize=1)
    return dict(zip(keys, secs)), time.perf_counter() - t0


def auto_plan(budget: int, dtype: torch.dtype) -> list[tuple[str, torch.dtype]]:
    """The (builder, logits dtype) pairs choose(kind="auto") builds at a budget (its check and the rounds)."""
    checks_in_dtype = "dtype" in inspect.signature(builders.checked_builder).parameters
    dtypes = [dtype] if checks_in_dtype else list(dict.fromkeys([torch.float32, dtype]))
    if hasattr(builders, "auto_kernel"):
        kernels = [builders.auto_kernel(budget)]
    else:  # before the rule: every Triton builder, the one-block one up to BLOCK_KERNEL_MAX_BUDGET
        kernels = [k for k in builders.KERNELS if k != "block" or budget <= builders.BLOCK_KERNEL_MAX_BUDGET]
    return [(k, d) for k in kernels for d in dtypes]


def self_test_variants() -> dict:
    """What tree_block.available()'s self-test launched before it was dropped (once per process)."""
    from ddtree_bench.engine.gpu.kernels.tree_block import TritonTreeBuilder

    b = TritonTreeBuilder(5, 11, 9, "cpu")
    x = torch.randn(5, 11, generator=torch.Generator().manual_seed(0))
    return launched_variants(lambda: b(x))


GEMM_ROWS = ((1, "AR verify"), (16, "draft block"), (15, "draft logits"), (17, "B=16 verify"), (33, "B=32 verify"),
             (65, "B=64 verify"))   # the row counts a DDTree run meets first, in order


def gemm_report(jobs: int) -> None:
    """--gemm: the weight-GEMM variants gemm.H200_TABLE launches for the 8B projections at each row count a run
    meets, the ones new at each, and their CPU seconds: the sum (compiled in turn) and the slowest (what
    fused.warm_linears waits for, a thread per variant)."""
    from ddtree_bench.engine.gpu.kernels.layer_ops import TritonOps

    table = h200_gemm_table
    ops = TritonOps(gemm_config=table)
    bf = torch.bfloat16
    weights = [(torch.empty(6144, 4096, dtype=bf), False), (torch.empty(4096, 4096, dtype=bf), False),
               (torch.empty(24576, 4096, dtype=bf), True), (torch.empty(4096, 12288, dtype=bf), False),
               (torch.empty(151936, 4096, dtype=bf), False)]   # q/k/v, o_proj, gate/up, down, lm_head
    seen: set = set()
    print("\nweight GEMM (gemm.H200_TABLE, Qwen3-8B projections), CPU seconds per row count:")
    for rows, what in GEMM_ROWS:
        def calls():
            for w, sw in weights:
                if table(rows, w.shape[0] // (2 if sw else 1), w.shape[1], bf, None, swiglu=sw) is not None:
                    (ops.swiglu if sw else ops.linear)(torch.empty(rows, w.shape[1], dtype=bf), w)
        vs = launched_variants(calls)
        new = {k: v for k, v in vs.items() if k not in seen}
        seen.update(new)
        secs = [c for c, _ in compile_all(new, jobs)[0].values()] if new else []
        print(f"  {what:13s} ({rows:3d} rows): {len(vs)} variants, {len(new)} new: {sum(secs):.1f} s in turn, "
              f"{max(secs, default=0.0):.1f} s at once", flush=True)


def forward_report(budgets: list[int], jobs: int, prefix: int, new_tokens: int) -> None:
    """--forward: what a sweep compiles at each step besides the tree builders: AR (one token), DFlash (a
    16-token chain), then each DDTree budget in order (B + 1 tokens); per step the Triton variants of
    round_variants that no earlier step launched, their CPU seconds, and the slowest kernel function's sum
    (what compiling one thread per function would wait for). Qwen3-8B shape, bf16, one layer standing for 36."""
    from ddtree_bench.perf.shapes import SHAPES as TARGET_SHAPES, random_shaped_pair

    shape = {**TARGET_SHAPES["qwen3-8b"], "num_hidden_layers": 1, "tie_word_embeddings": True}
    t0 = time.perf_counter()
    target, _ = random_shaped_pair(shape, dtype="bfloat16", device="cpu", with_drafter=False)
    L, ctx_layers, block = 15, 5, 16   # the DFlash drafter's block - 1, its target layers, its block
    print(f"one-layer Qwen3-8B target built in {time.perf_counter() - t0:.1f} s; prefix {prefix}, "
          f"{new_tokens} new tokens\n", flush=True)
    seen: set = set()
    rows = []
    for label, n, kind in [("AR", 1, "tree"), ("DFlash", block, "chain"), *[(f"B={b}", b + 1, "tree") for b in budgets]]:
        vs = round_variants(target, n, prefix, new_tokens, L=L, chain=kind == "chain", ctx_layers=ctx_layers,
                            block=block, cache_layers=36)
        new = {k: v for k, v in vs.items() if k not in seen}
        seen.update(new)
        secs = compile_all(new, jobs)[0] if new else {}
        per_fn: dict = {}
        for k, (c, _) in secs.items():
            per_fn[k[1]] = per_fn.get(k[1], 0.0) + c
        rows.append((label, n, len(vs), len(new), sum(c for c, _ in secs.values()), max(per_fn.values(), default=0.0),
                     ", ".join(f"{f} {c:.1f}" for f, c in sorted(per_fn.items(), key=lambda kv: -kv[1]))))
        print(f"  {label}: {len(new)} new of {len(vs)}", file=sys.stderr, flush=True)
    print("| step | tokens | variants | new | CPU s, in turn | slowest function | new, by function (CPU s) |")
    print("|---|---|---|---|---|---|---|")
    for label, n, nv, nn, total, slow, detail in rows:
        print(f"| {label} | {n} | {nv} | {nn} | {total:.1f} | {slow:.1f} | {detail} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", default="16,32,64,128,256,512,1024")
    ap.add_argument("--builders", default=",".join(builders.KERNELS), help="columns: each builder alone")
    ap.add_argument("--block-max", type=int, default=256, help="no one-block column above this budget")
    ap.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--jobs", type=int, default=1, help="variants compiled at once (forked processes)")
    ap.add_argument("--self-test", action="store_true", help="also the one-block self-test available() ran before")
    ap.add_argument("--gemm", action="store_true", help="only the weight GEMM's variants (gemm.H200_TABLE) per row count")
    ap.add_argument("--forward", action="store_true",
                    help="only what each step of a sweep compiles besides the tree builders (forward, argmax, tree compile/walk/commit)")
    ap.add_argument("--prefix", type=int, default=1024, help="--forward: tokens already in the cache")
    ap.add_argument("--new-tokens", type=int, default=64, help="--forward: max new tokens (sizes the cache)")
    a = ap.parse_args(argv)
    if a.forward:
        print(f"triton {triton.__version__}, target sm_90, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
        forward_report([int(b) for b in a.budgets.split(",")], a.jobs, a.prefix, a.new_tokens)
        return 0
    if a.gemm:
        print(f"triton {triton.__version__}, target sm_90, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
        gemm_report(a.jobs)
        return 0
    L, V = SHAPES[a.shape]
    dtype = getattr(torch, a.dtype)
    budgets = [int(b) for b in a.budgets.split(",")]
    names = [n for n in a.builders.split(",") if n]
    print(f"triton {triton.__version__}, target sm_90, shape {a.shape} (L={L}, V={V}), logits {a.dtype}, "
          f"jobs {a.jobs}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)

    found: dict = {}     # key -> Variant
    sets: dict = {}      # (builder, budget, dtype) -> keys

    def keys_of(name: str, budget: int, d: torch.dtype) -> list:
        if (name, budget, d) not in sets:
            vs = builder_variants(name, L, V, budget, d)
            found.update(vs)
            sets[(name, budget, d)] = list(vs)
        return sets[(name, budget, d)]

    columns = {(n, b): keys_of(n, b, dtype) for b in budgets for n in names if n != "block" or b <= a.block_max}
    plans = {b: auto_plan(b, dtype) for b in budgets}
    autos = {b: list(dict.fromkeys(k for n, d in plans[b] for k in keys_of(n, b, d))) for b in budgets}
    selftest = self_test_variants() if a.self_test else {}
    found.update(selftest)
    secs, wall = compile_all(found, a.jobs)

    def cost(keys) -> str:
        return f"{len(keys)}, {sum(secs[k][0] for k in keys):.1f}"

    print(f"\n{len(found)} distinct variants: {wall:.1f} s wall, {sum(c for c, _ in secs.values()):.1f} s CPU "
          f"(this process + ptxas), {sum(w for _, w in secs.values()):.1f} s wall summed\n")
    print("CPU seconds to compile (variants, s):\n")
    def critical(keys) -> str:   # warm(): one thread per kernel function, its variants in turn
        per_fn: dict = {}
        for k in keys:
            per_fn[k[1]] = per_fn.get(k[1], 0.0) + secs[k][0]
        return f"{max(per_fn.values(), default=0.0):.1f}"

    head = ["B"] + names + ["auto compiles", "auto", "auto, new in a sweep in this order",
                            "the same, one thread per kernel function"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    seen: set = set()
    for b in budgets:
        cells = [cost(columns[(n, b)]) if (n, b) in columns else "-" for n in names]
        label = " + ".join(n + ("" if d == dtype else f" (check, {str(d).split('.')[-1]})") for n, d in plans[b])
        new = [k for k in autos[b] if k not in seen]
        seen.update(autos[b])
        print("| " + " | ".join([str(b), *cells, label, cost(autos[b]), cost(new), critical(new)]) + " |")
    if a.self_test:
        print(f"\nonce per process, the one-block self-test tree_block.available() ran before this change (L=5, V=11, "
              f"B=9, fp32): {cost(list(selftest))}")
    print("\nslowest variants (CPU s):")
    for (_, name, spec, _), (c, w) in sorted(secs.items(), key=lambda kv: -kv[1][0])[:10]:
        consts = [v for t, v in eval(spec) if t == "constexpr"]  # noqa: S307 - our own repr of Triton's list
        print(f"  {c:6.2f}  {name} constexprs {consts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
