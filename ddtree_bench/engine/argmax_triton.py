"""The target's greedy picks - the row argmax of the verify logits - as one Triton launch.

`argmax_rows(logits [T, V]) -> [T] long` equals `logits.argmax(dim=-1)` exactly, including its
rules: the first index among equal maxima (-0.0 == +0.0), any NaN beats every number (the first
NaN wins), a row of -inf gives 0. PyTorch's CUDA reduction read the [257, 151,936] bf16 logits of a
B = 256 verify at ~1.5 TB/s (0.052 ms on an H200, benchmarks/h200-2026-11-29h); here one program
per row keeps a running best per lane - no reduction until the end - so the loads stream.
The PyTorch op is the twin (the plain engine uses it). Needs Triton (CUDA, or the CPU interpreter
in tests); knows nothing of models.
"""

from __future__ import annotations

import torch

from ddtree_bench.engine.tree_triton import tl, triton

BLOCK = 2048  # logits per lane-vector step

if triton is not None:

    @triton.jit
    def _argmax_kernel(x_ptr, out_ptr, stride, V: tl.constexpr, BLOCK: tl.constexpr):
        BIG: tl.constexpr = 2147483647
        row = x_ptr + tl.program_id(0).to(tl.int64) * stride
        i = tl.arange(0, BLOCK)
        m = i < V
        x = tl.load(row + i, mask=m, other=float("-inf")).to(tl.float32)
        nan = x != x
        best = tl.where(nan, float("-inf"), x)       # per lane: its best number so far ...
        at = tl.where(m, i, BIG)                     # ... and where it first occurred
        first_nan = tl.where(nan, i, BIG)
        for j0 in range(BLOCK, V, BLOCK):
            j = j0 + i
            x = tl.load(row + j, mask=j < V, other=float("-inf")).to(tl.float32)
            nan = x != x
            better = x > best                        # strict: an equal later value keeps the earlier index
            best = tl.where(better, x, best)
            at = tl.where(better, j, at)
            first_nan = tl.minimum(first_nan, tl.where(nan, j, BIG))
        top = tl.max(best, axis=0)
        pick = tl.min(tl.where(best == top, at, BIG), axis=0)
        nan_pick = tl.min(first_nan, axis=0)
        tl.store(out_ptr + tl.program_id(0), tl.where(nan_pick < BIG, nan_pick, pick).to(tl.int64))


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """logits [T, V] (any float dtype, rows contiguous) -> [T] long, = logits.argmax(dim=-1)."""
    T, V = logits.shape
    if triton is None or V >= 2**31 - 1:
        return logits.argmax(dim=-1)
    x = logits if logits.stride(-1) == 1 else logits.contiguous()
    out = torch.empty(T, dtype=torch.long, device=x.device)
    _argmax_kernel[(T,)](x, out, x.stride(0), V=V, BLOCK=BLOCK, num_warps=8)
    return out
