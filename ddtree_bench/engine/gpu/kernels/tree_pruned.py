"""The pieces both pruned Triton tree builds share (the one-block kernel, tree_block.py, and the grid
of small kernels, tree_grid.py): candidate regions and certificates, scratch buffers, inputs, and
the jit helpers for depth 1, candidates, the certificate boundary, subtree sizes / pre-order and
emitting nodes.

Candidate pruning: with parents f in key order and ranks r sorted, candidate (f, r) is beaten by
every (f', r') with f' <= f, r' <= r, so only (f+1)(r+1) <= B can be among the best B: about
B*ln(B) candidates per depth instead of B*K. The "beaten" argument can fail only when fp32 sums
round to exact ties, so every depth checks a certificate: the worst kept key must beat the best
excluded key (row f's first excluded rank, since keys grow along a row). A failed check raises the
builder's flag and the caller rebuilds the round with the exact PyTorch builder.
Needs Triton for the jit helpers; the host-side tables need only PyTorch.
"""

from __future__ import annotations

import torch

from ddtree_bench.engine.gpu.kernels.common import _pow2, tl, triton
from ddtree_bench.engine.gpu.kernels.topk import topk_logprobs_fused
from ddtree_bench.engine.tree_vector import depth_counts

if triton is not None:
    from ddtree_bench.engine.gpu.kernels.common import _desc, _max_combine

    @triton.jit
    def _depth_one(lp_ptr, ks_ptr, kl_ptr, lpar_ptr, lr_ptr, ls_ptr, size_ptr, K: tl.constexpr, KP: tl.constexpr):
        """Depth 1 (index 0): the top-K tokens; key order = lexicographic order = rank order."""
        j = tl.arange(0, KP)
        m = j < K
        s = tl.load(lp_ptr + j, mask=m, other=0.0)
        tl.store(ks_ptr + j, s, mask=m)
        tl.store(kl_ptr + j, j, mask=m)
        tl.store(lpar_ptr + j, tl.zeros([KP], tl.int32), mask=m)
        tl.store(lr_ptr + j, j, mask=m)
        tl.store(ls_ptr + j, s, mask=m)
        tl.store(size_ptr + j, tl.full([KP], 1, tl.int32), mask=m)

    @triton.jit
    def _candidates(d, i, regf_ptr, regr_ptr, ks_ptr, kl_ptr, lp_ptr, K: tl.constexpr, RP: tl.constexpr,
                    BP: tl.constexpr, TB: tl.constexpr):
        """Candidates i of depth d's region: (key, score, tie, valid). score = parent's score + the token's
        log-prob (fp32), tie = parent's lexicographic position * K + token rank, key = (_desc(score) << TB)
        | tie; invalid slots get the largest key."""
        f = tl.load(regf_ptr + d * RP + i, mask=i < RP, other=-1)
        r = tl.load(regr_ptr + d * RP + i, mask=i < RP, other=0)
        valid = f >= 0
        s = tl.load(ks_ptr + (d - 1) * BP + f, mask=valid, other=0.0)
        lx = tl.load(kl_ptr + (d - 1) * BP + f, mask=valid, other=0)
        lpv = tl.load(lp_ptr + d * K + r, mask=valid, other=0.0)
        score = s + lpv
        tie = lx.to(tl.int64) * K + r.to(tl.int64)
        key = tl.where(valid, (_desc(score) << TB) | tie, 9223372036854775807)
        return key, score, tie, valid

    @triton.jit
    def _boundary_min(d, bndf_ptr, bndr_ptr, ks_ptr, kl_ptr, lp_ptr, K: tl.constexpr, BP: tl.constexpr,
                      TB: tl.constexpr):
        """The best (smallest) key among the pruned rows' first excluded candidates at depth d: the worst
        kept key must be smaller (the certificate)."""
        b = tl.arange(0, BP)
        bf = tl.load(bndf_ptr + d * BP + b)
        br = tl.load(bndr_ptr + d * BP + b)
        bvalid = bf >= 0
        bs = tl.load(ks_ptr + (d - 1) * BP + bf, mask=bvalid, other=0.0)
        bl = tl.load(kl_ptr + (d - 1) * BP + bf, mask=bvalid, other=0)
        blp = tl.load(lp_ptr + d * K + br, mask=bvalid, other=0.0)
        bkey = tl.where(bvalid, (_desc(bs + blp) << TB) | (bl.to(tl.int64) * K + br.to(tl.int64)),
                        9223372036854775807)
        return tl.min(bkey, axis=0)

    @triton.jit
    def _sizes_and_preorder(cnt_ptr, lpar_ptr, size_ptr, pre_ptr, L: tl.constexpr, BP: tl.constexpr):
        """In one block, over the lexicographic-order arrays [L, BP]: subtree sizes bottom-up (size
        starts at 1 for every kept prefix), then pre-order index = lexicographic rank among all kept
        prefixes (depth-1 prefixes by running sums; deeper ones after their parent and older siblings)."""
        lane = tl.arange(0, BP)
        for e in range(1, L):
            d = L - e
            Fd = tl.load(cnt_ptr + d)
            m = lane < Fd
            p = tl.load(lpar_ptr + d * BP + lane, mask=m, other=0)
            sz = tl.load(size_ptr + d * BP + lane, mask=m, other=0)
            tl.atomic_add(size_ptr + (d - 1) * BP + p, sz, mask=m)
            tl.debug_barrier()
        m0 = lane < tl.load(cnt_ptr)
        sz = tl.load(size_ptr + lane, mask=m0, other=0)
        tl.store(pre_ptr + lane, tl.cumsum(sz, axis=0) - sz, mask=m0)
        tl.debug_barrier()
        for d in range(1, L):
            Fd = tl.load(cnt_ptr + d)
            m = lane < Fd
            sz = tl.load(size_ptr + d * BP + lane, mask=m, other=0)
            before = tl.cumsum(sz, axis=0) - sz
            p = tl.load(lpar_ptr + d * BP + lane, mask=m, other=0)
            pprev = tl.load(lpar_ptr + d * BP + lane - 1, mask=m & (lane > 0), other=-1)
            first = p != pprev
            gstart = tl.associative_scan(tl.where(first, before, 0), 0, _max_combine)
            base = tl.load(pre_ptr + (d - 1) * BP + p, mask=m, other=0) + 1
            tl.store(pre_ptr + d * BP + lane, base + before - gstart, mask=m)
            tl.debug_barrier()

    @triton.jit
    def _emit_nodes(p, g, m, nodeof_ptr, lpar_ptr, lr_ptr, tok_ptr, tok_out, par_out, dep_out, K: tl.constexpr,
                    BP: tl.constexpr):
        """Output rows p (pop order) from kept nodes g (flat [depth, lexicographic] index): token, depth,
        and parent node number (node_of of the parent's slot; 0 = root) - both tree builds end here."""
        d = g // BP
        r = tl.load(lr_ptr + g, mask=m, other=0)
        tl.store(tok_out + p, tl.load(tok_ptr + d * K + r, mask=m, other=0), mask=m)
        tl.store(dep_out + p, (d + 1).to(tl.int64), mask=m)
        pp = tl.load(lpar_ptr + g, mask=m, other=0)
        par = tl.load(nodeof_ptr + (d - 1) * BP + pp, mask=m & (d > 0), other=0)
        tl.store(par_out + p, tl.where(d > 0, par, 0).to(tl.int64), mask=m)


def pruned_regions(L: int, V: int, budget: int) -> tuple[int, list[int], list[tuple[list[int], list[int]]],
                                                          list[tuple[list[int], list[int]]]]:
    """K, prefixes kept per depth, and per depth d >= 1 the candidate region (parent f in key order,
    token rank r) with (f+1)(r+1) <= budget, plus the boundary (f, first excluded r) of every pruned
    row, whose best key the worst kept one must beat (the certificate). Index 0 is empty."""
    K, counts = depth_counts(L, V, budget)
    regions, bounds = [([], [])], [([], [])]
    for d in range(1, L):
        F = counts[d - 1]
        fs, rs, bfs, brs = [], [], [], []
        for f in range(F):
            lim = min(K, budget // (f + 1))
            fs += [f] * lim
            rs += list(range(lim))
            if lim < K:
                bfs.append(f)
                brs.append(lim)
        if len(fs) < counts[d]:  # pruning would keep too few: take every candidate, no certificate needed
            fs = [f for f in range(F) for _ in range(K)]
            rs = [r for _ in range(F) for r in range(K)]
            bfs, brs = [], []
        regions.append((fs, rs))
        bounds.append((bfs, brs))
    return K, counts, regions, bounds


def pruned_scratch(b, L: int, V: int, budget: int, device, round_regions, slots: int = 0) -> None:
    """Set up a pruned tree builder `b` (one-block or grid): shape constants (K, counts, N, BP, R =
    candidates per depth, RP = round_regions(max R), TB and GB key bits), the regions and boundaries as padded device
    tables, and the scratch arrays [L, BP] both kernels fill (key order: ks, kl; lexicographic
    order: lpar, lr, ls, size, pre) plus the certificate flag. `slots` > 0: one [L, BP] scratch per slot,
    [slots, L, BP] (the slotted one-block build; the tables and the flag stay one for all)."""
    if budget <= 0 or L <= 0:
        raise ValueError(f"{type(b).__name__} needs budget > 0 and L > 0")
    dev = torch.device(device)
    b.L, b.V, b.budget = L, V, budget
    K, counts, regions, bounds = pruned_regions(L, V, budget)
    b.K, b.counts = K, counts
    total = sum(counts)
    b.N = min(budget, total)
    BP = b.BP = _pow2(max(counts))
    b.R = [len(f) for f, _ in regions]       # candidates per depth (0 at depth 1)
    RP = b.RP = round_regions(max(b.R))
    pad = lambda xs, n: xs + [-1] * (n - len(xs))  # noqa: E731
    i32 = dict(dtype=torch.int32, device=dev)
    b.cnt = torch.tensor(counts, **i32)
    b.regf = torch.tensor([pad(f, RP) for f, _ in regions], **i32)
    b.regr = torch.tensor([pad(r, RP) for _, r in regions], **i32)
    b.bndf = torch.tensor([pad(f, BP) for f, _ in bounds], **i32)
    b.bndr = torch.tensor([pad(r, BP) for _, r in bounds], **i32)
    b.TB = max(1, (budget * K).bit_length())
    b.GB = max(1, total.bit_length())
    f32 = dict(dtype=torch.float32, device=dev)
    shape = (slots, L, BP) if slots else (L, BP)
    b.ks, b.ls = torch.zeros(shape, **f32), torch.zeros(shape, **f32)
    b.kl, b.lpar, b.lr = (torch.zeros(shape, **i32) for _ in range(3))
    b.size, b.pre = torch.zeros(shape, **i32), torch.zeros(shape, **i32)
    b.flag = torch.zeros(1, **i32)


def slotted_exact(b, slots: int, exact):
    """A slotted builder's exact batched builder (batch_tree.BatchTreeBuilder: `exact`, shared with the caller, or a
    new one for b's (L, V, budget)), after checking slots >= 1 and that it builds the same shape of tree."""
    from ddtree_bench.engine.gpu.batch_tree import BatchTreeBuilder

    if slots < 1:
        raise ValueError(f"{type(b).__name__} needs slots >= 1")
    exact = exact if exact is not None else BatchTreeBuilder(b.L, b.V, b.budget, b.flag.device)
    if (exact.L, exact.V, exact.budget) != (b.L, b.V, b.budget):
        raise ValueError("the exact builder must have the same (L, V, budget)")
    return exact


def slotted_inputs(b, draft_logits: torch.Tensor):
    """A slotted builder's kernel inputs for draft logits [C, L, V], 1 <= C <= b.slots: (C, lp, tok) with lp / tok
    [C, L, K] contiguous from `b.exact.logprobs` (each slot's normaliser on its own [L, V]: the exact builder's
    inputs, so a certified tree is its row), and the three [C, N] long outputs to fill."""
    if draft_logits.dim() != 3 or draft_logits.shape[1:] != (b.L, b.V) or not 1 <= draft_logits.shape[0] <= b.slots:
        raise ValueError(f"draft logits must be [C <= {b.slots}, {b.L}, {b.V}], got {list(draft_logits.shape)}")
    C = draft_logits.shape[0]
    lp, tok = b.exact.logprobs(draft_logits)
    outs = [torch.empty(C, b.N, dtype=torch.long, device=draft_logits.device) for _ in range(3)]
    return C, lp.contiguous(), tok.contiguous(), outs


def pruned_inputs(b, draft_logits: torch.Tensor):
    """A pruned builder's kernel inputs: (lp, tok) [L, K] contiguous (fused top-K where it applies) and
    the three [N] long outputs (token ids, parents, depths) to fill."""
    lp, tok = topk_logprobs_fused(draft_logits, b.K)
    outs = [torch.empty(b.N, dtype=torch.long, device=draft_logits.device) for _ in range(3)]
    return lp.contiguous(), tok.contiguous(), outs
