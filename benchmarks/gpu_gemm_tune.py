"""Tune the few-row weight GEMM (ddtree_bench/engine/gpu/kernels/gemm.py) against cuBLAS on this GPU.

For each projection of a model shape (merged q/k/v, o_proj, merged gate/up with its SiLU, down, lm_head)
and each row band (1, 2..16, ..32, ..64, ..128, ..256 rows; measured at the band's top), times
cuBLAS (F.linear; + the fused SiLU kernel for gate/up, which is what the forward ran before) and every
candidate launch shape of the Triton kernel, as one CUDA graph that runs an RMSNorm of x and then the GEMM
on it, over enough copies of the weight to overflow L2 (so every call reads its weight from HBM, and
follows a short kernel, as in a forward: with PDL, kernels/pdl.py, the GEMM prefetches its weight into L2
while the norm runs). o_proj and down are timed with what reads them in a forward, the residual add + RMSNorm
(`arms`: TritonOps.linear_add_rmsnorm, where a split Triton GEMM hands its partials to that kernel and runs no
reduce; cuBLAS's output is read by the same kernel); before 2026-12-04 they were timed with the reduce kernel
instead, which the forward does not run, and cuBLAS kept down at 9-32 rows where Triton's shape later won in the
forward (docs/gpu-performance.md). Times are of the norm + GEMM (+ add + norm); GB/s counts the weight bytes over them. Prints one line
per (projection, rows): cuBLAS ms, the best Triton shape and ms, their ratio and the achieved GB/s; the
table (per band the best shape where it beat cuBLAS by more than --min-gain, else cuBLAS) goes to --write
(JSON, for DDTREE_GEMM_TABLE or for pasting into gemm.H200_TABLE). Each band's compiles run first, a
thread per variant (kernels/warm.py). A pick is a candidate, not a verdict: it enters gemm.H200_TABLE
after benchmarks/gpu_verify_ab.py (and gpu_batch_ab.py for the batched rows) shows the forward gaining with it in the
same process, as isolated wins have not always carried over (docs/gpu-performance.md).

The candidates are launch shapes of kernels/gemm.py's pointer-tile kernel. (Until 2026-12-02 the shapes of a
persistent TMA kernel were timed too; it never won a band and was removed: docs/gpu-performance.md.)

    python benchmarks/gpu_gemm_tune.py --shape qwen3-8b --write table.json [--json all.json]
    python benchmarks/gpu_gemm_tune.py --bands 1,16,17,32,34,64,66 --rows 17,34,66 --over-h200 --write new-bands.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

from ddtree_bench.engine.gpu.graphs import replay_ms
from ddtree_bench.engine.gpu.kernels import gemm
from ddtree_bench.engine.gpu.kernels.gemm import GemmConfig
from ddtree_bench.engine.gpu.kernels.layer_ops import TritonOps
from ddtree_bench.engine.gpu.kernels.warm import warm
from ddtree_bench.perf.shapes import SHAPES

BANDS = (1, 16, 32, 64, 128, 256)   # a band: rows above the previous one up to this
SMEM_BYTES = 220 * 1024   # what a launch may use of an H200 SM's 227 KB
L2_SPAN_BYTES = 512 << 20  # the weight copies a timed graph cycles through (> 8x the L2)


def projections(shape: str) -> dict[str, tuple[int, int, bool]]:
    """name -> (N, K, swiglu) of the shape's weight GEMMs (N of gate_up: I, its output width)."""
    c = SHAPES[shape]
    H, I, D = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    qkv = (c["num_attention_heads"] + 2 * c["num_key_value_heads"]) * D
    return {"qkv": (qkv, H, False), "o_proj": (H, c["num_attention_heads"] * D, False), "gate_up": (I, H, True),
            "down": (H, I, False), "lm_head": (c["vocab_size"], H, False)}


ACC_REGS = 128   # fp32 accumulator registers a thread may hold (a 128 x 128 SwiGLU tile on 4 warps would take 256)


def candidates(block_m: int, swiglu: bool) -> list[GemmConfig]:
    """Launch shapes worth timing for a row block: weight tiles of 32..128 rows, K steps 64..256, pipelines
    of 2..6 stages (deeper for shorter K steps) within shared memory, 4 warps (also 8 for 128-row blocks and
    128-row weight tiles); split_k is added per problem; a shape whose fp32 accumulator(s) would take more than
    ACC_REGS registers a thread is left out (it spills). (256-row weight tiles were timed and lost:
    docs/gpu-performance.md, "Morning (H100, 2026-12-06)".)"""
    out = []
    depth = {64: (4, 5, 6), 128: (3, 4, 5), 256: (2, 3)}   # K step -> pipeline depths worth trying
    for bn, bk in itertools.product((32, 64, 128), depth):
      for stages in depth[bk]:
        for warps in ((4, 8) if block_m >= 128 or bn >= 128 else (4,)):   # ACC_REGS drops what would spill
            c = GemmConfig(block_m, bn, bk, 1, warps, stages)
            if (2 if swiglu else 1) * block_m * bn > ACC_REGS * 32 * warps:   # SwiGLU: a gate and an up accumulator
                continue
            if 24 * 1024 <= c.smem_bytes(swiglu) <= SMEM_BYTES:
                out.append(c)
    return out


def splits_for(c: GemmConfig, M: int, N: int, K: int, sms: int) -> list[int]:
    """split_k values that give about 1..4 programs per SM (never a K range under two K steps)."""
    tiles = math.ceil(N / c.block_n) * math.ceil(M / c.block_m)
    out = sorted({s for s in (1, 2, 3, 4, 6, 8) if K // s >= 2 * c.block_k and tiles * s <= 4 * sms
                  and (s == 1 or tiles * s >= sms // 2)})
    return out or [1]


RESIDUAL = ("o_proj", "down")   # projections whose output the forward's residual add + RMSNorm reads


def arms(name: str, x: torch.Tensor, ws: list[torch.Tensor], swiglu: bool, eps: float = 1e-6):
    """The two timed arms of one (projection, rows) as the forward runs them, each `fn(i)` on weight copy i:
    cuBLAS's (`base`) and, per launch shape c, the Triton GEMM's (`tri(c)`). Each runs the RMSNorm before the GEMM;
    for RESIDUAL projections also the residual add + RMSNorm after it (layer_ops.TritonOps.linear_add_rmsnorm:
    a split Triton GEMM's partials go straight into that kernel), and then returns its normed output."""
    cublas = TritonOps(gemm_config=gemm.cublas_only)
    norm_w = torch.ones(x.shape[1], device=x.device, dtype=x.dtype)
    pre = lambda: cublas.rmsnorm(x, norm_w, eps)  # noqa: E731 - the small kernel a forward runs before each GEMM
    if name in RESIDUAL:
        g = torch.Generator(x.device).manual_seed(1)
        res = torch.randn(x.shape[0], ws[0].shape[0], device=x.device, generator=g).to(x.dtype)
        out_w = torch.ones(ws[0].shape[0], device=x.device, dtype=x.dtype)

        def base(i):
            return cublas.linear_add_rmsnorm(res, pre(), ws[i], None, out_w, eps)[1]

        def tri(c):
            ops = TritonOps(gemm_config=lambda *a, **k: c)
            return lambda i: ops.linear_add_rmsnorm(res, pre(), ws[i], None, out_w, eps)[1]

        return base, tri
    op = gemm.swiglu if swiglu else gemm.linear
    base = (lambda i: cublas.swiglu(pre(), ws[i])) if swiglu else (lambda i: F.linear(pre(), ws[i]))
    return base, (lambda c: lambda i: op(pre(), ws[i], c))


def timed(fn_for, copies: int, reps: int) -> float:
    """ms per GEMM: a graph of `copies` calls (one per weight copy), replayed."""
    return replay_ms(lambda: [fn_for(i) for i in range(copies)], reps=reps) / copies


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--rows", default=",".join(map(str, BANDS)), help="row counts to time (a band's top enters the table)")
    ap.add_argument("--bands", default=",".join(map(str, BANDS)),
                    help="band tops, ascending (a band: rows above the previous top up to this one); a row count that is a "
                         "band's top enters the table")
    ap.add_argument("--over-h200", action="store_true",
                    help="--write gemm.H200_TABLE with the bands tuned here added or replaced (an A/B of new bands alone)")
    ap.add_argument("--over-builtin", action="store_true",
                    help="the same over this GPU's built-in table (gemm.builtin_table: H100_TABLE on an H100 SXM, "
                         "H200_TABLE on other sm_90 cards; none elsewhere, so the bands tuned here alone)")
    ap.add_argument("--only", default="", help="comma-separated projections (default: all)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--max-candidates", type=int, default=0, help="cap the shapes timed per band (0: all)")
    ap.add_argument("--min-gain", type=float, default=0.02, help="a shape enters the table if it beats cuBLAS by this share")
    ap.add_argument("--write", default="", help="write the winning table here (JSON)")
    ap.add_argument("--json", default="", help="write every measurement here (JSON)")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_gemm_tune: needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    dt = getattr(torch, a.dtype)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    projs = projections(a.shape)
    if a.only:
        projs = {k: v for k, v in projs.items() if k in a.only.split(",")}
    rows = [int(r) for r in a.rows.split(",")]
    bands = sorted(int(b) for b in a.bands.split(","))
    if any(r < 1 or r > bands[-1] for r in rows) or bands[-1] > gemm.GEMM_MAX_ROWS:
        print(f"gpu_gemm_tune: --rows must lie in 1..{bands[-1]}, --bands at most {gemm.GEMM_MAX_ROWS}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    from ddtree_bench.engine.gpu.kernels import pdl

    print(f"# {torch.cuda.get_device_name(dev)}, {sms} SMs, {a.shape} {a.dtype}, torch {torch.__version__}, "
          f"PDL {'on' if pdl.enabled(dev) else 'late up to ' + str(pdl.LATE_ROWS) + ' rows' if pdl.default_late(dev, 1) else 'off'}; times: RMSNorm + GEMM (+ residual add + RMSNorm: "
          f"{', '.join(RESIDUAL)})", flush=True)
    g = torch.Generator(device=dev).manual_seed(0)
    weights, silu = {}, TritonOps(gemm_config=gemm.cublas_only)   # silu: cuBLAS + the SiLU kernel (the reference values)
    for name, (N, K, sw) in projs.items():
        n_rows = 2 * N if sw else N
        copies = max(2, math.ceil(L2_SPAN_BYTES / (n_rows * K * 2)))
        weights[name] = [torch.randn(n_rows, K, device=dev, generator=g).to(dt) / math.sqrt(K) for _ in range(copies)]
    results, table = [], {}
    for M in rows:
        band = next(b for b in bands if M <= b)
        bm = max(16, 1 << (band - 1).bit_length()) if band <= 128 else 128
        for name, (N, K, sw) in projs.items():
            ws = weights[name]
            x = torch.randn(M, K, device=dev, generator=g).to(dt)
            base, tri = arms(name, x, ws, sw)
            want = (silu.swiglu(x, ws[0]) if sw else F.linear(x, ws[0])).float()
            cublas_ms = timed(base, len(ws), a.reps)
            # from 128 rows, and for a band just past a power of two (17, 34, 66: a budget's B + 1 tree nodes), also
            # two row blocks sharing the weight in L2
            bms = [bm] + ([bm // 2] if (band >= 128 or band & (band - 1)) and bm >= 32 else [])
            runs = [dataclasses_replace(c, split_k=s) for b_m in bms for c in candidates(b_m, sw)
                    for s in splits_for(c, M, N, K, sms)]
            if a.max_candidates:
                runs = runs[: a.max_candidates]
            op = gemm.swiglu if sw else gemm.linear
            try:
                warm(lambda: [op(x, ws[0], c) for c in runs], dev, per="variant")   # every shape compiled at once
            except Exception as e:  # one shape the compiler refuses: the others still compile at their first call below
                print(f"  {name} M={M} warm: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}", flush=True)
            best = {}   # "tiles" -> (launch, ms, err)
            for c in runs:
                try:
                    err = (op(x, ws[0], c).float() - want).abs().max().item()
                    ms = timed(tri(c), len(ws), a.reps)
                except Exception as e:  # a shape the compiler or the GPU refuses: skip it, say so
                    print(f"  {name} M={M} {c}: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}",
                          flush=True)
                    continue
                results.append({"proj": name, "rows": M, "config": c.__dict__, "ms": ms, "max_err": err})
                if err < 0.1 and ("tiles" not in best or ms < best["tiles"][1]):
                    best["tiles"] = (c, ms, err)
            bytes_ = ws[0].numel() * 2
            line = f"{name:8s} M={M:4d} cublas {cublas_ms * 1e3:8.1f} us ({bytes_ / cublas_ms / 1e6:6.0f} GB/s)"
            results.append({"proj": name, "rows": M, "config": "cublas", "ms": cublas_ms})
            if "tiles" in best:
                c, ms, err = best["tiles"]
                line += (f"  triton {ms * 1e3:8.1f} us ({bytes_ / ms / 1e6:6.0f} GB/s) "
                         f"x{cublas_ms / ms:5.2f}  {c.block_m}x{c.block_n}x{c.block_k} split{c.split_k} w{c.warps} "
                         f"s{c.stages} err {err:.1e}")
            top = min(best.values(), key=lambda b: b[1]) if best else None
            if M == band:
                win = top is not None and top[1] < cublas_ms * (1 - a.min_gain)
                table.setdefault((N, K, sw), []).append((band, top[0] if win else None))
            print(line + f"  [{len(runs)} shapes, {time.perf_counter() - t0:.0f} s]", flush=True)
        doc = save(a, dev, table, results)   # after every row count: a run cut short keeps what it measured
    print(json.dumps(doc))
    return 0


def save(a, dev, table, results) -> dict:
    """Write the table so far (--write) and every measurement (--json); returns the table document."""
    base = gemm.H200_TABLE if a.over_h200 else gemm.builtin_table(str(dev)) if a.over_builtin else None
    if base:   # the base table's bands, those tuned here added or replacing theirs
        table = gemm.merged(base, table, sorted(int(b) for b in a.bands.split(",")))
    doc = gemm.table_to_json({k: tuple(sorted(v, key=lambda b: b[0])) for k, v in table.items()})
    doc.update(device=torch.cuda.get_device_name(dev), capability=list(torch.cuda.get_device_capability(dev)),
               shape=a.shape, dtype=a.dtype)
    if a.write:
        with open(a.write, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"results": results, "table": doc}, f)
    return doc


def dataclasses_replace(c: GemmConfig, **kw) -> GemmConfig:
    from dataclasses import replace

    return replace(c, **kw)


if __name__ == "__main__":
    raise SystemExit(main())
