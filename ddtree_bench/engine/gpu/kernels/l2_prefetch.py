"""A weight pulled into L2 on a parallel branch of the stream, so that the GEMM that needs it next reads L2.

A short weight GEMM pays a ramp and a tail: on the 8B shape o_proj (33.5 MB of bf16) takes ~15 us at 1-16
rows against ~8 us of bytes at HBM speed (docs/gpu-performance.md, "H200, 2026-12-02"). The RoPE and the
attention before it read a few MB and leave HBM mostly idle for ~10-20 us. `start(w)` forks a side stream
off the current one and launches `_prefetch_kernel` there: PROGRAMS programs (few, so the attention keeps
the SMs) issue `prefetch.global.L2::evict_last` for every 128-byte line of w and end without waiting for the
lines. `join(side)` makes the current stream wait for the side stream again; a CUDA graph capture needs
every fork joined, and since the kernel writes nothing the join orders nothing else. Inside a capture the
fork is a parallel branch of the graph.

Only with DDTREE_GPU_EXPERIMENTAL=l2-prefetch (kernels/experimental.py; it has not run on a GPU), on CUDA
with the kernel compiled (not Triton's interpreter, which has no inline PTX) and a contiguous weight;
everywhere else both calls do nothing. Whether it is faster is a GPU measurement
(benchmarks/gpu_gemm.sh EXPERIMENTAL=l2-prefetch). Knows nothing of which weight comes next.
"""

from __future__ import annotations

import os

import torch

from ddtree_bench.engine.gpu.kernels import experimental, pdl
from ddtree_bench.engine.gpu.kernels.common import tl, triton

LINE_BYTES = 128   # an L2 line
PROGRAMS = 16      # of 132 SMs on an H200; DDTREE_L2_PREFETCH_PROGRAMS overrides it (an experiment's knob)
BLOCK = 256        # lines per program and step (2 per thread at 4 warps)
_SIDE: dict[str, torch.cuda.Stream] = {}


if triton is not None:

    @triton.jit
    def _prefetch_kernel(W, n_lines, LINE: tl.constexpr, BLOCK: tl.constexpr, PROGRAMS: tl.constexpr):
        for first in range(tl.program_id(0) * BLOCK, n_lines, PROGRAMS * BLOCK):
            idx = first + tl.arange(0, BLOCK)
            pdl.prefetch_l2(W + tl.where(idx < n_lines, idx, 0).to(tl.int64) * LINE)


def enabled(w: torch.Tensor) -> bool:
    """Whether start(w) launches anything here (see the module docstring)."""
    return (experimental.enabled("l2-prefetch") and triton is not None and w.is_cuda and w.is_contiguous()
            and os.environ.get("TRITON_INTERPRET") != "1")


def programs_wanted() -> int:
    """PROGRAMS, or DDTREE_L2_PREFETCH_PROGRAMS where set (a positive integer; else UsageError)."""
    raw = os.environ.get("DDTREE_L2_PREFETCH_PROGRAMS", "")
    if not raw:
        return PROGRAMS
    if not raw.isdigit() or int(raw) < 1:
        from ddtree_bench.errors import UsageError

        raise UsageError(f"DDTREE_L2_PREFETCH_PROGRAMS must be a positive integer, got {raw!r}")
    return int(raw)


def start(w: torch.Tensor) -> torch.cuda.Stream | None:
    """Ask L2 for all of w on a side stream forked off the current one; the side stream to join(), or None."""
    if not enabled(w):
        return None
    main = torch.cuda.current_stream(w.device)
    side = _SIDE.setdefault(str(w.device), torch.cuda.Stream(w.device))
    side.wait_stream(main)
    with torch.cuda.stream(side):
        n_lines = triton.cdiv(w.numel() * w.element_size(), LINE_BYTES)
        programs = programs_wanted()
        _prefetch_kernel[(min(programs, triton.cdiv(n_lines, BLOCK)),)](
            w, n_lines, LINE=LINE_BYTES // w.element_size(), BLOCK=BLOCK, PROGRAMS=programs, num_warps=4)
    return side


def join(side: torch.cuda.Stream | None) -> None:
    """The current stream waits for start()'s side stream (nothing when start launched nothing)."""
    if side is not None:
        torch.cuda.current_stream(side.device).wait_stream(side)


__all__ = ["LINE_BYTES", "PROGRAMS", "enabled", "join", "start"]
