"""The per-depth top-K of the draft logits in two Triton launches, for the tree kernels (K <= 64).

Same (logprobs [L, K], ids [L, K]) as `tree_static.topk_logprobs`, bit for bit: the same exact
int64 keys (descending logit, then ascending token id; NaN counts as -inf) and the same
log-probabilities, `logit - torch.logsumexp(...)` computed by the same PyTorch ops (so the tree
kernels stay equal to the PyTorch builder even on exact ties). Only the selection moves: the
vocabulary is cut into chunks of CHUNK tokens, each (depth, chunk) program pulls its K smallest keys
by K min-reductions (`_chunk_kernel`), then one program per depth pulls the K smallest of those
(`_merge_kernel`). On an H200 the PyTorch path (key build + int64 `topk` over 151,936 tokens) was
most of the 0.32 ms tree build at B = 16. K iterations of a reduction only pay at small K; larger K
go to `topk_logprobs`. Needs Triton (CUDA, or the CPU interpreter in tests).
"""

from __future__ import annotations

import torch

from ddtree_bench.engine.tree_static import fp32_logits, logprobs_at, topk_logprobs
from ddtree_bench.engine.tree_triton import _pow2, tl, triton

MAX_K = 64
CHUNK = 4096

if triton is not None:
    from ddtree_bench.engine.tree_triton import _desc

    @triton.jit
    def _chunk_kernel(x_ptr, out_ptr, V, stride, C, K: tl.constexpr, CH: tl.constexpr, VB: tl.constexpr):
        d = tl.program_id(0)
        c = tl.program_id(1)
        i = c * CH + tl.arange(0, CH)
        m = i < V
        x = tl.load(x_ptr + d * stride + i, mask=m, other=float("-inf")).to(tl.float32)
        x = tl.where(x != x, float("-inf"), x)
        key = tl.where(m, (_desc(x) << VB) | i.to(tl.int64), 9223372036854775807)
        for k in range(K):
            best = tl.min(key, axis=0)
            tl.store(out_ptr + (d * C + c) * K + k, best)
            key = tl.where(key == best, 9223372036854775807, key)

    @triton.jit
    def _merge_kernel(cand_ptr, ids_ptr, C, K: tl.constexpr, NP: tl.constexpr, VB: tl.constexpr):
        d = tl.program_id(0)
        j = tl.arange(0, NP)
        key = tl.load(cand_ptr + d * C * K + j, mask=j < C * K, other=9223372036854775807)
        for k in range(K):
            best = tl.min(key, axis=0)
            tl.store(ids_ptr + d * K + k, best & ((1 << VB) - 1))
            key = tl.where(key == best, 9223372036854775807, key)


def topk_logprobs_fused(draft_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """tree_static.topk_logprobs with the selection in Triton (k <= MAX_K; otherwise that function)."""
    L, V = draft_logits.shape
    if triton is None or k > MAX_K or k > V:
        return topk_logprobs(draft_logits, k)
    x = draft_logits.contiguous()
    C = triton.cdiv(V, CHUNK)
    VB = max(1, (V - 1).bit_length())
    cand = torch.empty(L, C, k, dtype=torch.long, device=x.device)
    ids = torch.empty(L, k, dtype=torch.long, device=x.device)
    _chunk_kernel[(L, C)](x, cand, V, x.stride(0), C, K=k, CH=CHUNK, VB=VB)
    _merge_kernel[(L,)](cand, ids, C, K=k, NP=_pow2(C * k), VB=VB)
    return logprobs_at(fp32_logits(draft_logits), ids), ids
