"""The per-depth top-K of the draft logits in Triton, for the tree kernels (K <= 4096).

Same (logprobs [L, K], ids [L, K]) as `tree_vector.topk_logprobs`, bit for bit: the same exact
int64 keys (descending logit, then ascending token id; NaN counts as -inf) and the same
log-probabilities, `logit - torch.logsumexp(...)` computed by the same PyTorch ops (so the tree
kernels stay equal to the PyTorch builder even on exact ties). Only the selection moves. The
vocabulary is cut into chunks of up to CHUNK tokens; each (depth, chunk) program keeps its K best
keys, then the best K of those are taken per depth. Two ways to take a chunk's K best:
* "min": K min-reductions (`_chunk_kernel`), merged by one program per depth (`_merge_kernel`).
  Cheap at small K, linear in K.
* "pruned": "min" on the chunks that can hold a depth's K best only: each chunk's best key first, then per depth
  tau = the K-th smallest of those (K chunks hold K distinct keys <= tau, so the K best are all <= tau), then each
  chunk whose best is <= tau emits its keys <= tau by min-reductions, stopping at the first past tau; the others
  read nothing. On random logits ~K chunks of V / CHUNK take part, each emitting a key or two: ~3 reductions a
  chunk instead of K. Every one of the K best reaches the merge, as with "min"; the keys "min" adds besides are
  all past tau, so the merge keeps the same K.
* "threshold": a binary search over the 32-bit score key for the chunk's K-th best score t (32
  counting steps whatever K; 16 for bf16 logits, whose keys' low 16 bits follow from their high
  16), then everything better than t plus the lowest token ids scoring exactly t, compacted with a
  prefix sum (`_select_kernel`); the C*K survivors per depth are merged the same way by one
  program per depth and sorted (`_merge_select_kernel`; one exact `torch.topk` over their
  composite keys above MERGE_MAX). Cost nearly flat in K.
Why these selections and constants (and what was tried and dropped): docs/gpu-performance.md.
Needs Triton (CUDA, or the CPU interpreter in tests).
"""

from __future__ import annotations

import torch

from ddtree_bench.engine.gpu.kernels.common import _pow2, tl, triton
from ddtree_bench.engine.tree_vector import fp32_logits, logprobs_at, topk_logprobs
from ddtree_bench.engine.gpu.kernels.warm import collecting, launch

MAX_K = 4096          # = CHUNK: the largest K a chunk can hold
CHUNK = 4096
MAX_CHUNK = 16384     # chunk_for widens chunks up to this so the survivors fit the Triton merge
MERGE_MAX = 16384     # survivors per depth the Triton merge holds in registers; more: one int64 torch.topk
SELECT_MIN_UP_TO = 16  # K up to this: min-reductions ("min") where "pruned" does not apply; above: the threshold search
PRUNED_UP_TO = 32      # K from 2 up to this, over at least K chunks: "pruned" (docs/gpu-performance.md)

if triton is not None:
    from ddtree_bench.engine.gpu.kernels.common import _desc

    @triton.jit
    def _chunk_scores(x_ptr, V, stride, CH: tl.constexpr):
        """Program (depth d, chunk c): token ids i, in-vocabulary mask m, score keys _desc(logit) (NaN as -inf)."""
        d = tl.program_id(0)
        i = tl.program_id(1) * CH + tl.arange(0, CH)
        m = i < V
        x = tl.load(x_ptr + d * stride + i, mask=m, other=float("-inf")).to(tl.float32)
        return i, m, _desc(tl.where(x != x, float("-inf"), x))

    @triton.jit
    def _chunk_keys(x_ptr, V, stride, CH: tl.constexpr, VB: tl.constexpr):
        """Program (depth d, chunk c): the chunk's composite keys (score key << VB) | token id, int64 max past V."""
        i, m, s = _chunk_scores(x_ptr, V, stride, CH)
        return tl.where(m, (s << VB) | i.to(tl.int64), 9223372036854775807)

    @triton.jit
    def _bisect(v, k, top, STEPS: tl.constexpr):
        """The smallest t in [0, top] with #(v <= t) >= k: STEPS block-wide counting steps (top < 2^STEPS)."""
        lo = tl.zeros((), tl.int64)
        hi = tl.full((), top, tl.int64)
        for _ in range(STEPS):
            mid = (lo + hi) // 2
            enough = tl.sum((v <= mid).to(tl.int32), axis=0) >= k
            hi = tl.where(enough, mid, hi)
            lo = tl.where(enough, lo, mid + 1)
        return lo

    @triton.jit
    def _kth_smallest(s, k, HALF: tl.constexpr):
        """The smallest t with #(s <= t) >= k, for 32-bit score keys s (int64; padding >= 2^32 never
        counts): a binary search, 32 block-wide counting steps - or 16 when HALF (bf16 logits: a key's
        low 16 bits follow from its high 16, so searching the high half and taking the smallest key
        there is exact)."""
        if HALF:
            high = _bisect(s >> 16, k, 65535, 16)
            t = tl.min(tl.where((s >> 16) == high, s, 9223372036854775807), axis=0)
        else:
            t = _bisect(s, k, 4294967295, 32)
        return t

    @triton.jit
    def _best_k(s, k, HALF: tl.constexpr):
        """Which of the score keys s are the k best (every key below the k-th smallest, then the first
        ones equal to it, in array order = token-id order), and each kept key's slot 0..k-1."""
        t = _kth_smallest(s, k, HALF)
        eq = s == t
        need = k - tl.sum((s < t).to(tl.int32), axis=0)
        take = (s < t) | (eq & (tl.cumsum(eq.to(tl.int32), axis=0) <= need))
        return take, tl.cumsum(take.to(tl.int32), axis=0) - 1

    @triton.jit
    def _chunk_kernel(x_ptr, out_ptr, V, stride, C, K: tl.constexpr, CH: tl.constexpr, VB: tl.constexpr):
        d = tl.program_id(0)
        c = tl.program_id(1)
        key = _chunk_keys(x_ptr, V, stride, CH, VB)
        for k in range(K):
            best = tl.min(key, axis=0)
            tl.store(out_ptr + (d * C + c) * K + k, best)
            key = tl.where(key == best, 9223372036854775807, key)

    @triton.jit
    def _chunk_min_kernel(x_ptr, cmin_ptr, V, stride, C, CH: tl.constexpr, VB: tl.constexpr):
        """"pruned", step 1: each (depth, chunk)'s best key at cmin[depth, chunk]."""
        d = tl.program_id(0)
        c = tl.program_id(1)
        tl.store(cmin_ptr + d * C + c, tl.min(_chunk_keys(x_ptr, V, stride, CH, VB), axis=0))

    @triton.jit
    def _bound_kernel(cmin_ptr, tau_ptr, C, K: tl.constexpr, CP: tl.constexpr):
        """"pruned", step 2: per depth tau = the K-th smallest chunk best (int64 max with fewer than K chunks). The K
        chunks it counts hold K distinct keys <= tau, so the depth's K best keys are all <= tau."""
        d = tl.program_id(0)
        j = tl.arange(0, CP)
        key = tl.load(cmin_ptr + d * C + j, mask=j < C, other=9223372036854775807)
        best = tl.min(key, axis=0)
        for _ in range(K - 1):
            key = tl.where(key == best, 9223372036854775807, key)
            best = tl.min(key, axis=0)
        tl.store(tau_ptr + d, best)

    @triton.jit
    def _chunk_pruned_kernel(x_ptr, cmin_ptr, tau_ptr, out_ptr, V, stride, C, K: tl.constexpr, KP: tl.constexpr,
                             CH: tl.constexpr, VB: tl.constexpr):
        """"pruned", step 3: the chunk's keys <= tau, ascending, up to K of them (padding int64 max), by the "min"
        steps, stopping at the first key past tau (a chunk whose best is past it reads nothing)."""
        d = tl.program_id(0)
        c = tl.program_id(1)
        tau = tl.load(tau_ptr + d)
        best = tl.load(cmin_ptr + d * C + c)
        k = 0
        if best <= tau:
            key = _chunk_keys(x_ptr, V, stride, CH, VB)
            while (k < K) & (best <= tau):
                tl.store(out_ptr + (d * C + c) * K + k, best)
                key = tl.where(key == best, 9223372036854775807, key)
                best = tl.min(key, axis=0)
                k += 1
        j = tl.arange(0, KP)
        tl.store(out_ptr + (d * C + c) * K + j, tl.full([KP], 9223372036854775807, tl.int64), mask=(j >= k) & (j < K))

    @triton.jit
    def _merge_kernel(cand_ptr, ids_ptr, C, K: tl.constexpr, NP: tl.constexpr, VB: tl.constexpr):
        d = tl.program_id(0)
        j = tl.arange(0, NP)
        key = tl.load(cand_ptr + d * C * K + j, mask=j < C * K, other=9223372036854775807)
        for k in range(K):
            best = tl.min(key, axis=0)
            tl.store(ids_ptr + d * K + k, best & ((1 << VB) - 1))
            key = tl.where(key == best, 9223372036854775807, key)

    @triton.jit
    def _select_kernel(x_ptr, out_ptr, V, stride, C, K: tl.constexpr, KP: tl.constexpr, CH: tl.constexpr,
                       VB: tl.constexpr, HALF: tl.constexpr):
        """(depth, chunk): the chunk's K smallest keys (fewer, padded with int64 max, if it holds fewer
        tokens), unordered, at out[depth, chunk, :K]."""
        d = tl.program_id(0)
        c = tl.program_id(1)
        i, m, s = _chunk_scores(x_ptr, V, stride, CH)
        s = tl.where(m, s, 4294967296)                   # score key in [0, 2^32), padding past it
        k = tl.minimum(tl.sum(m.to(tl.int32), axis=0), K)
        sel, pos = _best_k(s, k, HALF)
        base = out_ptr + (d * C + c) * K
        tl.store(base + pos, (s << VB) | i.to(tl.int64), mask=sel)
        j = tl.arange(0, KP)
        tl.store(base + j, tl.full([KP], 9223372036854775807, tl.int64), mask=(j >= k) & (j < K))

    @triton.jit
    def _merge_select_kernel(cand_ptr, ids_ptr, sel_ptr, n: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
                             NP: tl.constexpr, VB: tl.constexpr, HALF: tl.constexpr):
        """Depth d: the K smallest of the n survivor keys cand[d] (int64 max = padding), ascending, as token
        ids at ids[d, :K]. The chunks' search again on their score keys, held in registers (n <= NP),
        ties by array order (= token-id order: chunks in order, each compacted in id order), compacted
        to sel[d], then one in-block sort of those K keys."""
        BIG: tl.constexpr = 9223372036854775807
        d = tl.program_id(0)
        j = tl.arange(0, NP)
        key = tl.load(cand_ptr + d * n + j, mask=j < n, other=BIG)
        s = tl.where(key != BIG, key >> VB, 4294967296)
        take, pos = _best_k(s, K, HALF)
        tl.store(sel_ptr + d * KP + pos, key, mask=take)
        tl.debug_barrier()
        q = tl.arange(0, KP)
        kept = tl.sort(tl.load(sel_ptr + d * KP + q, mask=q < K, other=BIG))
        tl.store(ids_ptr + d * K + q, kept & ((1 << VB) - 1), mask=q < K)


def topk_logprobs_fused(draft_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """tree_vector.topk_logprobs with the selection in Triton (k <= MAX_K; otherwise that function): "pruned" for
    2 <= k <= PRUNED_UP_TO where the vocabulary spans at least k chunks, else "min" up to SELECT_MIN_UP_TO and
    "threshold" with the Triton merge above (H200, 2026-12-03, V = 151,936: pruned 0.077 / 0.091 ms at K = 16 / 32
    against min 0.092 and threshold 0.110, with log-probs; 0.085 against min's 0.370 over 240 rows at K = 16)."""
    return _topk(draft_logits, k)


def topk_ids_fused(draft_logits: torch.Tensor, k: int) -> torch.Tensor:
    """topk_logprobs_fused's ids [L, k] alone: the same selection, without the log-probs' pass over the logits
    (the batched builder takes each slot's normaliser on that slot's own rows: batch_tree.py)."""
    return _topk(draft_logits, k, with_logprobs=False)[1]


def selection(k: int, chunks: int) -> str:
    """The chunk selection topk_logprobs_fused takes for k over `chunks` chunks (its docstring says why)."""
    if 2 <= k <= min(PRUNED_UP_TO, chunks):
        return "pruned"
    return "min" if k <= SELECT_MIN_UP_TO else "threshold"


def chunk_for(k: int, V: int) -> int:
    """Tokens per chunk: CHUNK, doubled (up to MAX_CHUNK) while a depth's C*k survivors would not fit the
    Triton merge (MERGE_MAX), whose one launch beat torch.topk's over them (B = 512 on an H200: 0.16 ms
    in torch's single-block top-k against ~0.03 ms merging at B = 256; docs/gpu-performance.md)."""
    ch = CHUNK
    while ch < MAX_CHUNK and -(-V // ch) * k > MERGE_MAX:
        ch *= 2
    return ch


def _topk(draft_logits: torch.Tensor, k: int, select: str | None = None, chunk: int | None = None,
          merge: str = "triton", with_logprobs: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
    """topk_logprobs_fused with its knobs (gpu/_probe.py is their one entry): select "min" | "threshold"
    | "pruned" | None (by k); chunk: tokens per program (a power of two; None: chunk_for); merge: how "threshold" merges the
    chunks' survivors, "triton" (`_merge_select_kernel`, up to MERGE_MAX survivors per depth, else as
    "torch") or "torch" (one int64 `torch.topk`); with_logprobs=False: (None, ids)."""
    L, V = draft_logits.shape
    chunk = chunk or chunk_for(k, V)
    if triton is None or k > min(MAX_K, chunk) or k > V:
        lp, ids = topk_logprobs(draft_logits, k)
        return (lp if with_logprobs else None), ids
    x = draft_logits.contiguous()
    ch = min(chunk, _pow2(V))
    C = triton.cdiv(V, ch)
    select = select or selection(k, C)
    VB = max(1, (V - 1).bit_length())
    cand = torch.empty(L, C, k, dtype=torch.long, device=x.device)
    if select in ("min", "pruned"):
        ids = torch.empty(L, k, dtype=torch.long, device=x.device)
        warps = 4 if ch <= 4096 else 8
        if select == "min":
            launch(_chunk_kernel, (L, C), x, cand, V, x.stride(0), C, K=k, CH=ch, VB=VB, num_warps=warps)
        else:
            cmin = torch.empty(L, C, dtype=torch.long, device=x.device)
            tau = torch.empty(L, dtype=torch.long, device=x.device)
            launch(_chunk_min_kernel, (L, C), x, cmin, V, x.stride(0), C, CH=ch, VB=VB, num_warps=warps)
            launch(_bound_kernel, (L,), cmin, tau, C, K=k, CP=_pow2(C))
            launch(_chunk_pruned_kernel, (L, C), x, cmin, tau, cand, V, x.stride(0), C, K=k, KP=_pow2(k), CH=ch,
                   VB=VB, num_warps=warps)
        launch(_merge_kernel, (L,), cand, ids, C, K=k, NP=_pow2(C * k), VB=VB)
    elif select == "threshold":
        half = x.dtype == torch.bfloat16
        launch(_select_kernel, (L, C), x, cand, V, x.stride(0), C, K=k, KP=_pow2(k), CH=ch, VB=VB, HALF=half,
               num_warps=4 if ch < 2048 else (8 if ch <= 8192 else 16))
        n = C * k
        if merge == "triton" and n <= MERGE_MAX:
            ids = torch.empty(L, k, dtype=torch.long, device=x.device)
            sel = torch.empty(L, _pow2(k), dtype=torch.long, device=x.device)
            launch(_merge_select_kernel, (L,), cand, ids, sel, n=n, K=k, KP=_pow2(k), NP=_pow2(n), VB=VB, HALF=half,
                   num_warps=4 if n <= 2048 else (8 if n <= 4096 else 16))
        elif merge in ("triton", "torch"):
            ids = torch.topk(cand.view(L, C * k), k, dim=-1, largest=False, sorted=True).values & ((1 << VB) - 1)
        else:
            raise ValueError(f"unknown top-K merge {merge!r}: triton | torch")
    else:
        raise ValueError(f"unknown top-K selection {select!r}: min | pruned | threshold")
    if collecting():   # the launches were recorded, not run: ids holds no token ids (kernels/warm.py)
        return torch.zeros(L, k, device=x.device), torch.zeros(L, k, dtype=torch.long, device=x.device)
    if not with_logprobs:
        return None, ids
    return logprobs_at(fp32_logits(draft_logits), ids), ids
