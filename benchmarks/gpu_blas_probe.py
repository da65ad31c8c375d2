"""Probe: do cuBLAS's other entry points stream the few-row weight GEMMs faster than the one the forward calls?

The forward's cuBLAS GEMMs (every band gemm.config leaves to cuBLAS: 65-256 rows on the 8B shape) go through
F.linear, which PyTorch sends to cublasGemmEx. The same product has two more ways into cuBLAS, each with its own
kernel heuristic: cuBLASLt (`torch.backends.cuda.preferred_blas_library("cublaslt")`, read when a GEMM is called,
so it holds for what a graph captures) and the swapped orientation (W @ x^T, the output transposed: cuBLAS then
sees the few rows as its m, not its n). For each projection of a shape and each row count this times, as CUDA
graphs over enough weight copies to overflow L2 (every call reads its weight from HBM): F.linear (`gemmex`), the
same under cuBLASLt (`lt`), the swapped product on either (`swap`, `lt-swap`), and the engine's own pick for the
band (`engine`: its Triton shape, or cuBLAS through the entry ops.lt_gemms picks where the table has none). Prints us a GEMM, the weight's GB/s and each
arm against gemmex, with the max |difference| of its output against gemmex's (another summation order). gate_up is
timed as its plain [2I, K] GEMM (the engine's SwiGLU epilogue is not in any arm).

Only a probe: a win here is a candidate for the forward, decided by benchmarks/gpu_verify_ab.py in one process.

    python3 benchmarks/gpu_blas_probe.py --rows 16,17,32,64,65,128,129,256,257
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from ddtree_bench.engine.gpu.graphs import replay_ms
from ddtree_bench.engine.gpu.kernels import gemm
from ddtree_bench.engine.gpu.ops import TORCH_OPS, blas_library
from ddtree_bench.perf.shapes import SHAPES
from gpu_gemm_tune import L2_SPAN_BYTES, projections   # weight bytes a timed graph cycles through; [N, K] by name


def arms(x: torch.Tensor, M: int):
    """name -> fn(w) -> output [M, N] (or its transpose) for one weight copy w."""
    def engine(w):
        c = gemm.config(M, w.shape[0], w.shape[1], x.dtype, x.device)
        return TORCH_OPS.linear(x, w) if c is None else gemm.linear(x, w, c)

    def on(backend, fn):
        def run(w):
            with blas_library(backend):
                return fn(w)
        return run

    plain, swap = (lambda w: F.linear(x, w)), (lambda w: torch.mm(w, x.t()))
    return {"gemmex": on("cublas", plain), "lt": on("cublaslt", plain), "swap": on("cublas", swap),
            "lt-swap": on("cublaslt", swap), "engine": engine}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES))
    ap.add_argument("--rows", default="16,17,32,64,65,128,129,256,257")
    ap.add_argument("--only", default="qkv,o_proj,gate_up,down", help="projections: qkv,o_proj,gate_up,down,lm_head")
    ap.add_argument("--reps", type=int, default=15)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_blas_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    # [N, K] of each weight: the tuner's projections, gate/up as its one [2I, K] matrix
    shapes = {name: (2 * n if swiglu else n, k) for name, (n, k, swiglu) in projections(a.shape).items()}
    dev, dt = torch.device("cuda"), torch.bfloat16
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  cuda {torch.version.cuda}  shape {a.shape}")
    print(f"{'proj':8} {'rows':>4} {'gemmex us':>9} {'GB/s':>6} | " + " | ".join(f"{n:>7} x  (maxdiff)" for n in
                                                                                 ("lt", "swap", "lt-swap", "engine")))
    g = torch.Generator(dev).manual_seed(0)
    for name in a.only.split(","):
        N, K = shapes[name]
        nbytes = N * K * 2
        copies = max(2, -(-L2_SPAN_BYTES // nbytes))
        ws = [(torch.randn(N, K, device=dev, generator=g) * K ** -0.5).to(dt) for _ in range(copies)]
        for M in map(int, a.rows.split(",")):
            x = torch.randn(M, K, device=dev, generator=g).to(dt)
            fns = arms(x, M)
            ref = fns["gemmex"](ws[0]).float()
            us, diff = {}, {}
            for arm, fn in fns.items():
                us[arm] = 1e3 * replay_ms(lambda fn=fn, ws=ws: [fn(w) for w in ws], reps=a.reps) / copies
                out = fn(ws[0]).float()
                diff[arm] = (out.t() if out.shape != ref.shape else out).sub(ref).abs().max().item()
            line = " | ".join(f"{us[n]:7.1f} {us[n] / us['gemmex']:5.3f} ({diff[n]:.3f})" for n in
                              ("lt", "swap", "lt-swap", "engine"))
            print(f"{name:8} {M:4d} {us['gemmex']:9.1f} {nbytes / us['gemmex'] / 1e3:6.0f} | {line}", flush=True)
        ws.clear()
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
