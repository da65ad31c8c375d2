"""The target's greedy picks - the row argmax of the verify logits - as two Triton launches.

`argmax_rows(logits [T, V]) -> [T] long` equals `logits.argmax(dim=-1)` exactly, including its
rules: the first index among equal maxima (-0.0 == +0.0), any NaN beats every number (the first
NaN wins), a row of -inf gives 0. (What PyTorch's reduction costs: docs/gpu-performance.md.) Here each row is
cut into S spans, S chosen so that rows x spans fill the GPU twice over; a program keeps a running
best per lane over its span (no reduction until the end, so the loads stream) and writes one int64
key, (rank << 31) | index with rank 0 for NaN and 1 + the descending score key otherwise, so the
smallest key is the answer; a second launch takes each row's smallest.
The PyTorch op is the twin (the plain engine uses it). Needs Triton (CUDA, or the CPU interpreter
in tests); knows nothing of models.
"""

from __future__ import annotations

import torch

from ddtree_bench.engine.gpu.kernels.common import _pow2, tl, triton
from ddtree_bench.engine.gpu.kernels.warm import launch

BLOCK = 2048       # logits per lane-vector step
PROGRAMS = 512     # aim: rows x spans >= this (a few per SM)

if triton is not None:
    from ddtree_bench.engine.gpu.kernels.common import _desc

    @triton.jit
    def _span_kernel(x_ptr, part_ptr, stride, V: tl.constexpr, SPAN: tl.constexpr, S: tl.constexpr,
                     BLOCK: tl.constexpr):
        """Program (row, span): the span's answer as one int64 key at part[row, span]."""
        BIG: tl.constexpr = 2147483647
        row, sp = tl.program_id(0), tl.program_id(1)
        base = x_ptr + row.to(tl.int64) * stride
        i = sp * SPAN + tl.arange(0, BLOCK)
        m = i < V
        x = tl.load(base + i, mask=m, other=float("-inf")).to(tl.float32)
        nan = x != x
        best = tl.where(nan, float("-inf"), x)       # per lane: its best number so far ...
        at = tl.where(m, i, BIG)                     # ... and where it first occurred
        first_nan = tl.where(nan, i, BIG)
        for j0 in range(BLOCK, SPAN, BLOCK):
            j = sp * SPAN + j0 + tl.arange(0, BLOCK)
            x = tl.load(base + j, mask=j < V, other=float("-inf")).to(tl.float32)
            better = x > best                        # strict: an equal later value keeps the earlier index
            best = tl.where(better, x, best)
            at = tl.where(better, j, at)
            first_nan = tl.minimum(first_nan, tl.where(x != x, j, BIG))
        top = tl.max(best, axis=0)
        pick = tl.min(tl.where(best == top, at, BIG), axis=0)
        nan_pick = tl.min(first_nan, axis=0)
        key = tl.where(nan_pick < BIG, nan_pick.to(tl.int64), ((1 + _desc(top)) << 31) | pick.to(tl.int64))
        tl.store(part_ptr + row * S + sp, key)

    @triton.jit
    def _pick_kernel(part_ptr, out_ptr, S: tl.constexpr, SP: tl.constexpr):
        row = tl.program_id(0)
        s = tl.arange(0, SP)
        key = tl.min(tl.load(part_ptr + row * S + s, mask=s < S, other=9223372036854775807), axis=0)
        tl.store(out_ptr + row, key & 2147483647)


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits [T, V] (any float dtype, rows contiguous) -> [T] long, = logits.argmax(dim=-1)."""
    T, V = logits.shape
    if triton is None or V >= 2**31 - 1 or T == 0:
        return logits.argmax(dim=-1)
    x = logits if logits.stride(-1) == 1 else logits.contiguous()
    blocks = triton.cdiv(V, BLOCK)
    span = triton.cdiv(blocks, min(blocks, triton.cdiv(PROGRAMS, T))) * BLOCK
    S = triton.cdiv(V, span)
    part = torch.empty(T, S, dtype=torch.long, device=x.device)
    out = torch.empty(T, dtype=torch.long, device=x.device)
    launch(_span_kernel, (T, S), x, part, x.stride(0), V=V, SPAN=span, S=S, BLOCK=BLOCK, num_warps=8)
    launch(_pick_kernel, (T,), part, out, S=S, SP=_pow2(S))
    return out
