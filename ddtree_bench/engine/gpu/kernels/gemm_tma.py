"""The few-row weight GEMM (x [M <= 256, K] @ W[N, K]^T) as a persistent Triton kernel that reads its tiles with
Hopper's TMA: a candidate beside kernels/gemm.py's pointer-tile kernel for 64-256 rows, picked per table band
when a GemmConfig's kernel is one of KINDS (gemm.linear / gemm.swiglu / gemm.linear_unreduced dispatch here).

Work units are (row block, K range, weight tile) triples, row blocks varying fastest (the row blocks of one
weight tile run side by side, the second reading it from L2), then K ranges, then weight tiles; one program
per SM (`programs`) loops over units pid, pid + programs, ..., so the weight stream keeps every SM busy
without a tail wave of fresh launches. Each unit streams its x [BLOCK_M, BLOCK_K] and W [BLOCK_N, BLOCK_K]
tiles through host-built TMA descriptors (triton.tools.tensor_descriptor.TensorDescriptor, Triton >= 3.3):
the copy engine writes them to shared memory swizzled for wgmma, and zero-fills rows and columns beyond
the tensor, so ragged M, N and K need no masks on the loads. A descriptor holds its base address and is
passed by value as a kernel parameter, so a CUDA graph bakes it at capture exactly as it bakes a pointer:
valid while the captured x and weight buffers stay where they are, which the static forward guarantees.
Three forms (GemmConfig.kernel): "tma" pipelines each unit's K loop; "tma-flat" flattens the unit loop into
the K loop (tl.range(flatten=True); the K loop has the same trip count in every unit so Triton can), so the
pipeline runs on into the next unit instead of draining at each epilogue; "tma-ws" warp-specialises the unit
loop (tl.range(warp_specialize=True), which Triton's Hopper pass takes on the persistent loop, not the K loop):
a TMA producer warp group feeds wgmma consumer groups, and a launch of 4 warps runs 12. sm_90+ only.

Epilogues and partials are the pointer-tile kernel's (kernels/gemm_parts.py): the SwiGLU variant keeps a gate
and an up accumulator of the same columns of the merged [gate | up] weight and writes _swiglu_epilogue(gate, up)
(the SiLU rounded where ops.TorchOps.silu_mul rounds it); split_k > 1 writes fp32 partials [split, M, N (+ I of
up)] that _gemm_split_reduce sums in range order (or hands on as SplitSums). Twins: F.linear and
TorchOps.silu_mul(F.linear), as for gemm.py. TMA needs 16-byte aligned bases and row strides: an x that has
neither is copied first into rows padded to 16 bytes (it is small); a weight is refused (ValueError).
Knows nothing of models, nor which shape is fast (benchmarks/gpu_gemm_tune.py measures that).
"""

from __future__ import annotations

from functools import lru_cache

import torch

from ddtree_bench.engine.gpu.kernels import gemm_parts, pdl
from ddtree_bench.engine.gpu.kernels.common import tl, triton
from ddtree_bench.engine.gpu.kernels.warm import launch as _launch

INTERPRETER_PROGRAMS = 3   # "SMs" under TRITON_INTERPRET (or without a GPU): few, so a program loops over units

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except Exception:  # pragma: no cover - Triton missing or older than 3.3
    TensorDescriptor = None

SUPPORTED = triton is not None and TensorDescriptor is not None
KINDS = tuple(k for k in gemm_parts.KERNELS if k != "tiles")   # the GemmConfig.kernel values this file runs


if triton is not None:

    @triton.jit(do_not_specialize=["M", "N", "k_per_split", "k_steps", "m_blocks", "splits", "n_units"])
    def _tma_gemm_kernel(XD, WD, Y, M, N, k_per_split, k_steps, up_rows, sy, s_split, m_blocks, splits, n_units,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PROGRAMS: tl.constexpr,
                         SWIGLU: tl.constexpr, PARTIAL: tl.constexpr, PRECISION: tl.constexpr, FLATTEN: tl.constexpr,
                         WARP_SPECIALIZE: tl.constexpr, USE_GDC: tl.constexpr):
        pdl.enter(USE_GDC)
        for unit in tl.range(tl.program_id(0), n_units, PROGRAMS, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
            pid_m = unit % m_blocks
            pid_k = (unit // m_blocks) % splits
            pid_n = unit // (m_blocks * splits)
            m0 = pid_m * BLOCK_M
            n0 = pid_n * BLOCK_N
            k0 = pid_k * k_per_split
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for i in range(0, k_steps):   # the same count in every unit (a loop nest Triton can flatten)
                k = k0 + i * BLOCK_K
                x = XD.load([m0, k])
                acc = tl.dot(x, WD.load([n0, k]).T, acc, input_precision=PRECISION)
                if SWIGLU:
                    acc_up = tl.dot(x, WD.load([up_rows + n0, k]).T, acc_up, input_precision=PRECISION)
            rm = m0 + tl.arange(0, BLOCK_M)
            rn = n0 + tl.arange(0, BLOCK_N)
            gemm_parts._store_tile(Y, acc, acc_up, rm, rn, (rm < M)[:, None] & (rn < N)[None, :], pid_k, s_split, sy,
                                   up_rows, SWIGLU, PARTIAL)


@lru_cache(maxsize=None)
def _sm_count(device: str) -> int:
    return torch.cuda.get_device_properties(torch.device(device)).multi_processor_count


@lru_cache(maxsize=None)
def _capability(device: str) -> tuple[int, int]:
    return torch.cuda.get_device_capability(torch.device(device))


def programs_for(device) -> int:
    """The persistent grid's size on `device`: one program per SM (INTERPRETER_PROGRAMS under the interpreter)."""
    import os

    dev = torch.device(device)
    if dev.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return INTERPRETER_PROGRAMS
    return _sm_count(str(dev))


def _aligned(t: torch.Tensor) -> bool:
    """What a TMA descriptor needs of a 2-D tensor: contiguous rows, 16-byte aligned base and row stride."""
    return t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0


def run(x: torch.Tensor, w: torch.Tensor, n_out: int, up_rows: int, launch: gemm_parts.GemmConfig,
        reduce: bool = True) -> torch.Tensor | gemm_parts.SplitSums:
    """gemm._run's contract on the TMA kernel: out [M, n_out] (swiglu when up_rows > 0: the up weight rows start
    at up_rows); reduce=False leaves a split launch's partials unreduced (gemm_parts.SplitSums)."""
    if not SUPPORTED:
        raise RuntimeError("the TMA GEMM needs Triton >= 3.3 (triton.tools.tensor_descriptor)")
    if x.is_cuda and _capability(str(x.device))[0] < 9:
        raise RuntimeError(f"the TMA GEMM needs sm_90 or newer, {x.device} has {_capability(str(x.device))}")
    if launch.kernel not in KINDS:
        raise ValueError(f"not a TMA kernel: {launch.kernel!r}")
    if not _aligned(w):
        raise ValueError(f"the TMA GEMM needs a 16-byte aligned weight (base and row stride), got strides {w.stride()}")
    if not _aligned(x):   # copied into rows that start 16-byte aligned (the row stride padded to 16 bytes)
        pad = 16 // x.element_size()
        buf = torch.empty((x.shape[0], triton.cdiv(x.shape[1], pad) * pad), dtype=x.dtype, device=x.device)
        buf[:, : x.shape[1]].copy_(x)
        x = buf[:, : x.shape[1]]
    M, K = x.shape
    c = launch
    split = max(1, min(c.split_k, triton.cdiv(K, c.block_k)))
    k_steps = triton.cdiv(triton.cdiv(K, split), c.block_k)   # per range; the last one's steps past K read zeros
    k_per_split = k_steps * c.block_k
    split = triton.cdiv(K, k_per_split)
    swiglu = up_rows > 0
    m_blocks = triton.cdiv(M, c.block_m)
    n_units = m_blocks * triton.cdiv(n_out, c.block_n) * split
    programs = programs_for(x.device)
    xd = TensorDescriptor(x, [M, K], [x.stride(0), 1], [c.block_m, c.block_k])
    wd = TensorDescriptor(w, [w.shape[0], K], [w.stride(0), 1], [c.block_n, c.block_k])
    prec = "ieee" if x.dtype == torch.float32 else "tf32"   # fp32 (the tests' twin check) multiplies exactly
    gdc = pdl.enabled(x.device)
    grid = (min(n_units, programs),)
    consts = dict(BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, PROGRAMS=programs, SWIGLU=swiglu,
                  PRECISION=prec, FLATTEN=c.kernel == "tma-flat", WARP_SPECIALIZE=c.kernel == "tma-ws", USE_GDC=gdc,
                  num_warps=c.warps, num_stages=c.stages, launch_pdl=gdc)
    y = torch.empty((M, n_out), dtype=x.dtype, device=x.device)
    if split == 1:
        _launch(_tma_gemm_kernel, grid, xd, wd, y, M, n_out, k_per_split, k_steps, up_rows, y.stride(0), 0,
                m_blocks, split, n_units, PARTIAL=False, **consts)
        return y
    part = torch.empty((split, M, n_out * (2 if swiglu else 1)), dtype=torch.float32, device=x.device)
    _launch(_tma_gemm_kernel, grid, xd, wd, part, M, n_out, k_per_split, k_steps, up_rows,
            part.stride(1), part.stride(0), m_blocks, split, n_units, PARTIAL=True, **consts)
    if not reduce:
        return gemm_parts.SplitSums(part, x.dtype)
    _launch(gemm_parts._gemm_split_reduce, (M, triton.cdiv(n_out, gemm_parts.REDUCE_BLOCK)),
            part, y, n_out, split, up_rows, part.stride(0), part.stride(1), y.stride(0),
            SWIGLU=swiglu, BLOCK=gemm_parts.REDUCE_BLOCK, USE_GDC=gdc, num_warps=4, launch_pdl=gdc)
    return y
