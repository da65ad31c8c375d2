"""The parts of the few-row GEMM (kernels/gemm.py) that are not its main loop: the launch shape of one GEMM
(`GemmConfig`), the SwiGLU epilogue (silu(gate) * up, rounded where ops.TorchOps.silu_mul rounds), the split-K
partials (`SplitSums`) and the kernel that sums them in range order (`_gemm_split_reduce`). (A persistent TMA
kernel shared these until 2026-12-02; it lost to this one, NaN'd in one launch form, and was removed:
docs/gpu-performance.md.) Knows nothing of models or of which shape is fast.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ddtree_bench.engine.gpu.kernels import pdl
from ddtree_bench.engine.gpu.kernels.common import tl, triton

# GemmConfig.kernel: "tiles", kernels/gemm.py's pointer-tile kernel, the only one (a table naming another is refused)
KERNELS = ("tiles",)
REDUCE_BLOCK = 1024   # columns per program of _gemm_split_reduce


@dataclass(frozen=True)
class GemmConfig:
    """Launch shape of one GEMM: output tile block_m x block_n, K step block_k, K split into split_k ranges, and
    the kernel that runs it (a name in KERNELS)."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    warps: int = 4
    stages: int = 4
    kernel: str = "tiles"

    def smem_bytes(self, swiglu: bool = False, elem: int = 2) -> int:
        """Shared memory of the pipeline: `stages` copies of the x tile and the weight tile(s)."""
        return self.stages * self.block_k * (self.block_m + self.block_n * (2 if swiglu else 1)) * elem


@dataclass
class SplitSums:
    """A split-K GEMM's output before its reduction: fp32 partial sums [splits, M, N], one per K range;
    out = (sum over splits, in split order) rounded to `dtype` - what _gemm_split_reduce would write, left
    to the kernel that reads it (layer_ops' residual add + RMSNorm)."""

    parts: torch.Tensor
    dtype: torch.dtype


if triton is not None:

    @triton.jit
    def _swiglu_epilogue(g, u, dt: tl.constexpr):
        """silu(gate) * up as ops.TorchOps.silu_mul computes it on the GEMM's rounded outputs."""
        gf = g.to(dt).to(tl.float32)
        s = (gf / (1.0 + tl.exp(-gf))).to(dt).to(tl.float32)
        return (s * u.to(dt).to(tl.float32)).to(dt)

    @triton.jit
    def _gemm_split_reduce(P, Y, N, splits, up_rows, s_split, sp, sy, SWIGLU: tl.constexpr, BLOCK: tl.constexpr,
                           USE_GDC: tl.constexpr, GDC_LATE: tl.constexpr = False):
        pdl.enter(USE_GDC, GDC_LATE)
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = cols < N
        base = P + row * sp + cols
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK,), dtype=tl.float32)
        for s in range(0, splits):
            acc += tl.load(base + s * s_split, mask=ok, other=0.0)
            if SWIGLU:
                acc_up += tl.load(base + s * s_split + up_rows, mask=ok, other=0.0)
        pdl.release(USE_GDC, GDC_LATE)
        if SWIGLU:
            tl.store(Y + row * sy + cols, _swiglu_epilogue(acc, acc_up, Y.dtype.element_ty), mask=ok)
        else:
            tl.store(Y + row * sy + cols, acc.to(Y.dtype.element_ty), mask=ok)

    @triton.jit
    def _store_tile(Y, acc, acc_up, rm, rn, ok, pid_k, s_split, sy, up_rows, SWIGLU: tl.constexpr, PARTIAL: tl.constexpr):
        """A GEMM program's output tile (rows rm, columns rn, mask ok): fp32 partial sums [split, M, N (+ N of up)]
        for _gemm_split_reduce (PARTIAL), else the finished tile in Y's dtype (through the SwiGLU epilogue)."""
        if PARTIAL:
            out = Y + pid_k * s_split + rm[:, None] * sy + rn[None, :]
            tl.store(out, acc, mask=ok)
            if SWIGLU:
                tl.store(out + up_rows, acc_up, mask=ok)
        else:
            out = Y + rm[:, None] * sy + rn[None, :]
            if SWIGLU:
                tl.store(out, _swiglu_epilogue(acc, acc_up, Y.dtype.element_ty), mask=ok)
            else:
                tl.store(out, acc.to(Y.dtype.element_ty), mask=ok)
