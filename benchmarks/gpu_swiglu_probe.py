"""Probe: above 128 rows, does gate/up with its SiLU in the Triton GEMM's epilogue beat cuBLAS + the SiLU-mul kernel?

Above the tuning table's last gate/up band (64 rows on either card) the forward runs the MLP's first GEMM on cuBLAS
and then the SiLU-mul kernel, which reads the [M, 2I] output back and writes [M, I]: at 1024 rows on the 8B shape
that is ~75 MB a layer at the card's bandwidth (docs/gpu-performance.md, "Known gaps"). The Triton GEMM's SwiGLU
epilogue (kernels/gemm.swiglu) never writes that intermediate, but at these rows the GEMM is compute-bound and
the kernel streams pointer tiles, not cuBLAS's Hopper pipeline. This times, per row count, as CUDA graphs over
enough weight copies to overflow L2: the engine's path (TritonOps.swiglu: what the forward runs now, cuBLAS + the
SiLU-mul where the table names no shape), the same split in two (cuBLAS alone, the SiLU-mul alone), and each
candidate launch shape of gemm.swiglu; prints us a GEMM, TFLOP/s and each against the engine, with the max
|difference| to the engine's output (another summation order).

Only a probe: a win is a candidate band for the tuning table, decided by benchmarks/gpu_verify_ab.py (a
DDTREE_GEMM_TABLE with the band, and gemm.GEMM_MAX_ROWS raised for it) in one process.

    python3 benchmarks/gpu_swiglu_probe.py --rows 129,256,257,512,1024
"""

from __future__ import annotations

import argparse
import sys

import torch

from ddtree_bench.engine.gpu.graphs import replay_ms
from ddtree_bench.engine.gpu.kernels import gemm
from ddtree_bench.engine.gpu.kernels.gemm import GemmConfig
from ddtree_bench.engine.gpu.kernels.layer_ops import TritonOps
from ddtree_bench.engine.gpu.ops import TORCH_OPS
from ddtree_bench.perf.shapes import SHAPES
from gpu_gemm_tune import L2_SPAN_BYTES, SMEM_BYTES

# (block_m, block_n, block_k, split_k, warps, stages): compute-bound tiles (8 warps = two warpgroups at 128 rows)
CANDIDATES = tuple(GemmConfig(*c) for c in (
    (64, 64, 64, 1, 4, 4), (64, 128, 64, 1, 4, 3), (64, 128, 64, 1, 8, 3), (128, 64, 64, 1, 4, 4),
    (128, 64, 64, 1, 8, 4), (128, 128, 64, 1, 8, 3), (128, 128, 32, 1, 8, 4), (128, 128, 64, 1, 8, 2),
    (256, 64, 64, 1, 8, 3), (128, 256, 64, 1, 8, 2)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES))
    ap.add_argument("--rows", default="129,256,257,512,1024")
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_swiglu_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    c = SHAPES[a.shape]
    H, I = c["hidden_size"], c["intermediate_size"]
    dev, dt = torch.device("cuda"), torch.bfloat16
    ops = TritonOps()
    g = torch.Generator(dev).manual_seed(0)
    copies = max(2, -(-L2_SPAN_BYTES // (2 * I * H * 2)))
    ws = [(torch.randn(2 * I, H, device=dev, generator=g) * H ** -0.5).to(dt) for _ in range(copies)]
    cands = [k for k in CANDIDATES if k.smem_bytes(swiglu=True) <= SMEM_BYTES]
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  shape {a.shape}  gate/up [{2 * I}, {H}]  "
          f"{copies} weight copies")

    def per_call_us(fn) -> float:
        """us of one fn(w), replayed in a graph over every weight copy (each read from HBM)."""
        return 1e3 * replay_ms(lambda: [fn(w) for w in ws], reps=a.reps) / copies

    for M in map(int, a.rows.split(",")):
        x = torch.randn(M, H, device=dev, generator=g).to(dt)
        gu = TORCH_OPS.linear(x, ws[0])
        ref = ops.swiglu(x, ws[0]).float()
        engine = per_call_us(lambda w: ops.swiglu(x, w))
        blas = per_call_us(lambda w: TORCH_OPS.linear(x, w))
        silu = per_call_us(lambda w: ops.silu_mul(gu))
        tflops = 2 * M * H * 2 * I / engine / 1e6
        print(f"rows {M:5d}: engine {engine:7.1f} us ({tflops:5.0f} TFLOP/s) = cuBLAS {blas:7.1f} + SiLU-mul "
              f"{silu:5.1f}", flush=True)
        for k in cands:
            try:
                out = gemm.swiglu(x, ws[0], k)
                us = per_call_us(lambda w, k=k: gemm.swiglu(x, w, k))
            except Exception as e:   # a shape this card cannot launch (registers, shared memory): say so, go on
                print(f"   {k.block_m:3d}x{k.block_n:3d}x{k.block_k:3d} w{k.warps} s{k.stages}: {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:80]}")
                continue
            diff = out.float().sub(ref).abs().max().item()
            print(f"   {k.block_m:3d}x{k.block_n:3d}x{k.block_k:3d} w{k.warps} s{k.stages}: {us:7.1f} us  "
                  f"x engine {us / engine:5.3f}  ({2 * M * H * 2 * I / us / 1e6:5.0f} TFLOP/s, maxdiff {diff:.4f})",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
