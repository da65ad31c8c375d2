"""Could the verify's attention split in two - the prefix on PyTorch's own attention backends, the tree on ours?

Issue 35's item 2 (verify within 1.15x its GEMM-only floor) is missed at n = 64-256 and the tree kernel
(kernels/tree_attention.py) is the largest part outside the GEMMs there: ~14 us a layer at n = 128 and ~30 at
n = 256 on an H200 (2026-12-04, bench-engine --profile), against ~3.5 / 7 us for its FLOPs at ~700 TFLOP/s.
The prefix part of that attention is plain dense attention (every tree row sees every committed slot, no mask),
the shape flash-attention kernels are built for; the tree part is small (n rows over <= n nodes). A split would run
the prefix through SDPA (which computes each row's log-sum-exp, so the two partials merge exactly as the split-KV
combine does) and the tree through our kernel with a prefix of 0. This times, per forward (36 layers, each its own
K/V, CUDA-graph replays, Qwen3-8B's 32 query / 8 KV heads, head dim 128, bf16), for each n:

* tree       - what the engine runs today (tree_attend over prefix + tree, config()'s launch, the visibility words
               made once outside the timed layers, as the engine makes them once a forward);
* tree-only  - the same kernel over the tree alone (prefix 0): the tree half of a split;
* prefix/<b> - SDPA over the prefix alone, no mask, with backend b forced (flash, cudnn, efficient; GQA through
               enable_gqa, else K/V expanded to the query heads beforehand, outside the timing): the other half;
* whole/<b>  - SDPA over prefix + tree with the tree's additive bias, backend b forced (the one-call alternative).

A split wins if prefix/<best> + tree-only + a combine (~3 us a layer, ~0.1 ms a forward) is below tree. `err` is
the largest difference from the float32 math reference of the same part. Backends the GPU or PyTorch cannot run
for a shape print `-` and their error's type. Prints one table; no engine code reads this.

    python3 benchmarks/gpu_probe_attention_backends.py [--tokens 64,128,256,512] [--prefix 1024]
    TRITON_INTERPRET=1 python3 benchmarks/gpu_probe_attention_backends.py --device cpu --dtype float32 --tokens 16 --layers 1 --prefix 64  # smoke
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch
import torch.nn.functional as F

from gpu_attention_tune import D, HKV, HQ, L, tree_for   # the tune's 8B attention shape and DDTree-shaped trees

BACKENDS = ("flash", "cudnn", "efficient")


def backend_enum(name: str):
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[name]


def timed_ms(fn, dev: torch.device, reps: int) -> float | None:
    """Median ms of CUDA-graph replays of fn (the engine's timer); on a CPU fn runs once and no time is taken."""
    if dev.type != "cuda":
        fn()
        return None
    from ddtree_bench.engine.gpu.graphs import replay_ms

    try:
        return replay_ms(fn, reps=reps)
    except RuntimeError:   # a backend that cannot be captured: time it eagerly between events instead
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


def sdpa(q, k, v, backend: str, bias=None):
    """SDPA with one backend forced; q [1, HQ, n, D], k / v [1, HKV or HQ, S, D]."""
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel([backend_enum(backend)]):
        if k.shape[1] == q.shape[1]:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)


def main() -> None:
    from ddtree_bench.engine.gpu.kernels import tree_attention as tree
    from ddtree_bench.engine.gpu.kernels.tree_verify import compile_tree

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="64,128,256,512")
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--scale", type=float, default=3.0, help="draft logits x this: 3 wide trees, 12 deep ones")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", help="float32 for the CPU smoke run (Triton's interpreter has no bf16)")
    a = ap.parse_args()
    warnings.simplefilter("ignore", UserWarning)   # SDPA's per-backend "not used because ..." lines: the table says it
    dev, dt = torch.device(a.device), getattr(torch, a.dtype)
    ns = [int(x) for x in a.tokens.split(",")]
    cap = -(-(a.prefix + max(ns)) // 64) * 64
    gen = torch.Generator(device=dev).manual_seed(0)
    ks = [torch.randn(HKV, cap, D, device=dev, dtype=dt, generator=gen) for _ in range(a.layers)]
    vs = [torch.randn(HKV, cap, D, device=dev, dtype=dt, generator=gen) for _ in range(a.layers)]
    g = HQ // HKV
    # the prefix halves as SDPA reads them: [1, H, prefix, D] views, and copies expanded to the query heads
    kp = [k[:, : a.prefix].unsqueeze(0) for k in ks]
    vp = [v[:, : a.prefix].unsqueeze(0) for v in vs]
    kpx = [k.repeat_interleave(g, dim=1).contiguous() for k in kp]
    vpx = [v.repeat_interleave(g, dim=1).contiguous() for v in vp]
    start, zero = torch.tensor(a.prefix, device=dev), torch.tensor(0, device=dev)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"# {name}, torch {torch.__version__}; {a.layers} layers, {HQ}/{HKV} heads, D {D}, prefix {a.prefix}, "
          f"logits x {a.scale:g}; ms per forward (CUDA-graph replays, median of {a.reps})", flush=True)
    cols = ["tree", "tree-only"] + [f"prefix/{b}" for b in BACKENDS] + [f"whole/{b}" for b in BACKENDS]
    print(f"{'n':>5} " + " ".join(f"{c:>15}" for c in cols) + "   split(best) vs tree", flush=True)
    for n in ns:
        tok, par, dep = tree_for(n, a.scale, dev)
        root = torch.zeros(1, dtype=torch.long, device=dev)
        _, pos, _, bias, path = compile_tree(root, tok, par, dep, start, cap, dt, g, L)
        _, pos0, _, _, path0 = compile_tree(root, tok, par, dep, zero, cap, dt, g, L)
        q = torch.randn(HQ, n, D, device=dev, dtype=dt, generator=gen)
        q4 = q.unsqueeze(0)
        # the whole attention over prefix + tree: bias [n, cap] -> the live part [1, 1, n, prefix + n]
        # (bias rows are the folded (query head in group, node) rows; every head of a group has the same n rows)
        live_bias = bias[:n, : a.prefix + n].reshape(1, 1, n, a.prefix + n)
        kw = [k[:, : a.prefix + n].unsqueeze(0) for k in ks]
        vw = [v[:, : a.prefix + n].unsqueeze(0) for v in vs]
        # the tree alone lives in slots 0..n-1 of its own cache: the tree part of each layer's K/V, moved down
        kt = [k[:, a.prefix: a.prefix + n].contiguous() for k in ks]
        vt = [v[:, a.prefix: a.prefix + n].contiguous() for v in vs]
        kt = [torch.cat([t, torch.zeros(HKV, cap - n, D, device=dev, dtype=dt)], dim=1) for t in kt]
        vt = [torch.cat([t, torch.zeros(HKV, cap - n, D, device=dev, dtype=dt)], dim=1) for t in vt]
        cells, errs, fails = {}, {}, []

        def ref(kk, vv, b=None):
            return F.scaled_dot_product_attention(q4.float(), kk.float().repeat_interleave(g, dim=1) if kk.shape[1] != HQ
                                                  else kk.float(), vv.float().repeat_interleave(g, dim=1)
                                                  if vv.shape[1] != HQ else vv.float(),
                                                  attn_mask=None if b is None else b.float())

        def run(col, each, check):
            try:   # eagerly first, so that a backend refusing the shape fails outside a graph capture
                out, want = check()
                errs[col] = float((out.float().reshape(want.shape) - want).abs().max())
                cells[col] = timed_ms(lambda: [each(i) for i in range(a.layers)], dev, a.reps)
            except Exception as e:   # a backend that cannot run this shape: say which, keep going
                cells[col] = None
                fails.append(f"{col}: {type(e).__name__}: {str(e).splitlines()[0][:90] if str(e) else ''}")

        want_whole = ref(kw[0], vw[0], live_bias)
        # the visibility words, made once per forward by the engine (TreeRows), so outside the timed layers here
        words, words0 = tree.vis_words(path, pos, start), tree.vis_words(path0, pos0, zero)
        run("tree", lambda i: tree.tree_attend(q, ks[i], vs[i], path, pos, start, words=words),
            lambda: (tree.tree_attend(q, ks[0], vs[0], path, pos, start, words=words).reshape(n, HQ, D).transpose(0, 1)
                     .unsqueeze(0), want_whole))
        want_tree = ref(kt[0][:, :n].unsqueeze(0), vt[0][:, :n].unsqueeze(0), live_bias[..., a.prefix:])
        run("tree-only", lambda i: tree.tree_attend(q, kt[i], vt[i], path0, pos0, zero, words=words0),
            lambda: (tree.tree_attend(q, kt[0], vt[0], path0, pos0, zero, words=words0).reshape(n, HQ, D)
                     .transpose(0, 1).unsqueeze(0), want_tree))
        want_prefix = ref(kp[0], vp[0])
        for b in BACKENDS:
            try:   # GQA through enable_gqa where the backend takes it, else the copies expanded to the query heads
                sdpa(q4, kp[0], vp[0], b)
                kk, vv = kp, vp
            except RuntimeError:
                kk, vv = kpx, vpx
            run(f"prefix/{b}", lambda i, b=b, kk=kk, vv=vv: sdpa(q4, kk[i], vv[i], b),
                lambda b=b, kk=kk, vv=vv: (sdpa(q4, kk[0], vv[0], b), want_prefix))
            run(f"whole/{b}", lambda i, b=b: sdpa(q4, kw[i], vw[i], b, live_bias),
                lambda b=b: (sdpa(q4, kw[0], vw[0], b, live_bias), want_whole))
        def fmt(c: str) -> str:   # "ms (err)"; on a CPU (no timing) "ran (err)"
            if c not in errs:
                return "-"
            return f"{'ran' if cells.get(c) is None else f'{cells[c]:.3f}'} ({errs[c]:.0e})"
        best = min((cells[f"prefix/{b}"] for b in BACKENDS if cells.get(f"prefix/{b}") is not None), default=None)
        verdict = "-"
        if best is not None and cells.get("tree-only") is not None and cells.get("tree"):
            split = best + cells["tree-only"] + 0.1
            verdict = f"{split:.3f} ms = {split / cells['tree']:.2f}x"
        print(f"{n:5d} " + " ".join(f"{fmt(c):>15}" for c in cols) + f"   {verdict}", flush=True)
        for f in fails:
            print(f"      {f}", flush=True)


if __name__ == "__main__":
    main()
