"""The draft logits' log-softmax at chosen ids with the normaliser's elementwise steps in one Triton pass.

`logprobs_at(draft_logits [C, L, V] or [L, V], ids [.., L, K])` gives tree_vector.logprobs_at(fp32_logits(x), ids)
(the twin) bit for bit where `exact_here` holds. The twin runs, in PyTorch over every row: an fp32 copy, NaN -> -inf,
the row max (a max of +-inf counts as 0), x - max, exp, each slot's sum, log, + max: five full passes over the
fp32 logits before the sums. Here one program per row reads x (bf16 or fp32) twice: the max of fp32(x) with NaN as
-inf (a max is order-free: the same bits as amax), then exp(fp32(x) - m) into an fp32 buffer - the twin's
`(logits - m).exp_()` element for element, if the exp is the same function. The sums stay PyTorch's, each on its
slot's own contiguous [L, V] block (their order depends on the shape reduced: tree_vector.log_normalisers), and log
and + m are the twin's ops; the log-probs are gathered from x itself (bf16 -> fp32 is exact).
The exp is libdevice's expf, the function PyTorch's CUDA exp kernel compiles to; Triton builds with flush-to-zero,
which can only zero results below 2^-126, too small to move a sum that holds exp(0) = 1. That it gives the twin's
bits is an assumption checked, not proved: `exact_here(device, dtype)` compares both on `probe_logits` (rows of
bf16 bit patterns scaled to maxima from 1e-3 to 3e4, so x - m spans exp's whole range, plus an inf, a NaN and an
all -inf row) once per process, device and dtype; the batched tree builder takes the twin where it fails.
Knows nothing of trees.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from ddtree_bench.engine.gpu.kernels.common import triton, tl
from ddtree_bench.engine.gpu.kernels.warm import collecting, launch
from ddtree_bench.engine.tree_vector import fp32_logits, logprobs_at as logprobs_at_twin, logprobs_from, normalisers_from

BLOCK = 4096   # tokens per step of a row's two passes

if triton is not None:
    from triton.language.extra import libdevice

    @triton.jit
    def _row(X, i, V):
        x = tl.load(X + i, mask=i < V, other=float("-inf")).to(tl.float32)
        return tl.where(x != x, float("-inf"), x)   # NaN -> -inf (fp32_logits); +-inf stay

    @triton.jit
    def _shifted_exp_kernel(X, E, M, V, sx, BLOCK: tl.constexpr, LIBDEVICE: tl.constexpr):
        """Row r: m = max(fp32(x)) (0 where +-inf) at M[r]; exp(fp32(x) - m) at E[r, :V]. LIBDEVICE: libdevice's
        expf (on a GPU; tl.exp there is a faster, coarser exp), else tl.exp (the CPU interpreter has no libdevice)."""
        r = tl.program_id(0).to(tl.int64)
        X += r * sx
        E += r * V
        run = tl.full([BLOCK], float("-inf"), tl.float32)
        for v0 in range(0, V, BLOCK):
            run = tl.maximum(run, _row(X, v0 + tl.arange(0, BLOCK), V))
        m = tl.max(run, axis=0)
        m = tl.where((m == float("inf")) | (m == float("-inf")), 0.0, m)
        tl.store(M + r, m)
        for v0 in range(0, V, BLOCK):
            i = v0 + tl.arange(0, BLOCK)
            t = _row(X, i, V) - m
            if LIBDEVICE:
                t = libdevice.exp(t)
            else:
                t = tl.exp(t)
            tl.store(E + i, t, mask=i < V)


def shifted_exp(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """rows [R, V] (last dim contiguous) -> (exp(fp32(x) - m) [R, V] fp32, m [R, 1] fp32): log_normalisers' max and
    elementwise steps, one launch."""
    R, V = rows.shape
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    e = torch.empty(R, V, dtype=torch.float32, device=rows.device)
    m = torch.empty(R, 1, dtype=torch.float32, device=rows.device)
    launch(_shifted_exp_kernel, (R,), rows, e, m, V, rows.stride(0), BLOCK=BLOCK, LIBDEVICE=rows.device.type == "cuda",
           num_warps=8)
    return e, m


def logprobs_at(draft_logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The twin's log-probs at ids: draft_logits [L, V] or [C, L, V] (any float dtype), ids [.., L, K] long ->
    fp32 [.., L, K]; each slot's sum on its own [L, V] block, as the twin takes it."""
    shape = draft_logits.shape
    e, m = shifted_exp(draft_logits.reshape(-1, shape[-1]))
    if collecting():   # launches recorded, not run (kernels/warm.py): e holds nothing yet
        return torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)
    norm = normalisers_from(e.view(shape), m.view(*shape[:-1], 1))
    return logprobs_from(fp32_logits(draft_logits.gather(-1, ids)), norm)


def probe_logits(dtype: torch.dtype, device, V: int = 4096) -> torch.Tensor:
    """[3, 15, V] logits `exact_here` compares on: the bf16 bit patterns in order (fp32: normals spread over 2^+-30),
    non-finite ones as 0, each row scaled to its own maximum from 1e-3 to 3e4; an inf in row 0, a NaN in row 1, row 2
    all -inf."""
    n = 3 * 15 * V
    if dtype == torch.bfloat16:
        pats = torch.arange(n, dtype=torch.int32) % 65536
        x = (pats.to(torch.int16)).view(torch.bfloat16).to(torch.float32)
    else:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-30, 30, (n,), generator=g).float())
    x = torch.where(torch.isfinite(x), x.clamp(-3e4, 3e4), torch.zeros_like(x)).view(3, 15, V)
    x = x / x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30) * torch.logspace(-3, 4.5, 45).view(3, 15, 1)
    x[0, 0, 7], x[0, 1, 9], x[0, 2] = float("inf"), float("nan"), -float("inf")
    return x.to(device=device, dtype=dtype)


@lru_cache(maxsize=8)
def exact_here(device: str, dtype: torch.dtype) -> bool:
    """Whether logprobs_at gives the twin's bits on this device for logits of this dtype (probe_logits, all K = V
    ids): the exp's bits, checked once per process, device and dtype."""
    if triton is None:
        return False
    x = probe_logits(dtype, device)
    ids = torch.arange(x.shape[-1], device=x.device).expand(*x.shape[:-1], -1).contiguous()
    want = logprobs_at_twin(fp32_logits(x), ids)
    got = logprobs_at(x, ids)
    return bool(torch.equal(got.view(torch.int32), want.view(torch.int32)))


__all__ = ["BLOCK", "exact_here", "logprobs_at", "probe_logits", "shifted_exp"]
