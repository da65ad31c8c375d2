"""The DDTree tree build as ~32 small Triton launches that use the whole GPU, for large budgets.

Same tree as `build_tree` / `StaticTreeBuilder` / the one-block kernel (`tree_block`): same fp32
sums, same exact int64 keys, same candidate pruning and certificate (`tree_pruned.pruned_regions`),
same (score, pre-order) final order. What differs is how the per-depth "keep the best F_d of the
candidates, in key order" is done: the one-block kernel sorts ~B*ln(B) keys on one SM per depth
(slow at large B); here every candidate finds its own rank by
counting the keys smaller than its own, spread over as many thread blocks as the candidates need
(keys are unique, so the ranks are a permutation and the kept ones land at their rank). Per depth
two launches: rank the candidates (`_rank_kernel`), then rank the kept ones by their lexicographic
tie to get the trie order (`_lex_kernel`). Then one block computes subtree sizes and pre-order
indices (as the one-block kernel does), a grid ranks all kept nodes by (score, pre-order) and a
last grid writes the best N in pop order with their parents.
Counting is O(n^2) work but n is small (<= ~7.7k candidates at B = 1024) and spread over the GPU:
each counting program ranks only ROWS items, so even B = 64's few hundred candidates fill dozens
of SMs. The launches cost a few microseconds each inside a CUDA graph, which is why the smallest
budgets use the one-block kernel (gpu/builders.py's rule, from where the crossover sat on an H200:
docs/gpu-performance.md).
Every launch has a second grid axis over slots (`SlottedGridBuilder`: the batched loop's rounds of 2+ requests,
program (i, c) working on slot c's own inputs, scratch and outputs); the single build is that axis at 1, so both
run the same compiled kernels.
Scratch lives in preallocated device buffers; every launch has fixed shapes (graph-capturable).
Needs Triton and a CUDA device (or Triton's CPU interpreter, which the tests use).
"""

from __future__ import annotations

import torch

from ddtree_bench.engine.gpu.kernels import experimental
from ddtree_bench.engine.gpu.kernels.common import _pow2, tl, triton
from ddtree_bench.engine.gpu.kernels.tree_pruned import pruned_inputs, pruned_scratch, slotted_exact, slotted_inputs
from ddtree_bench.engine.gpu.kernels.warm import launch

BI = 64  # items per program of the one-pass kernels (keys, emit)
ROWS = 8  # items ranked per program of the counting kernels (rank, lex, select): fewer rows, more programs (docs/gpu-performance.md)
BJ = 64  # columns (items compared against) per inner step
BJ_KEYS = 128  # the same, reading precomputed keys (keys_first)
KEYS_WIDTHS = (64, 128, 256, 512, 1024, 2048)  # the BJ_KEYS an A/B may set (DDTREE_GRID_KEYS_BJ)
LEX_WIDTHS = (64, 128, 256)  # the lex loop's (DDTREE_GRID_LEX_BJ)

if triton is not None:
    from ddtree_bench.engine.gpu.kernels.common import _desc
    from ddtree_bench.engine.gpu.kernels.tree_pruned import _boundary_min, _candidates, _depth_one, _emit_nodes, \
        _sizes_and_preorder

    @triton.jit
    def _count_smaller(acc, kj, key, ONCE: tl.constexpr):
        """acc + which of the column keys kj are smaller than each row's key: per row ([BI]), or with ONCE per
        (row, column) ([BI, BJ], no reduction inside the loop: `_counted` sums it once at the end)."""
        smaller = (kj[None, :] < key[:, None]).to(tl.int32)
        if ONCE:
            return acc + smaller
        else:
            return acc + tl.sum(smaller, axis=1)

    @triton.jit
    def _counted(acc, ONCE: tl.constexpr):
        if ONCE:
            return tl.sum(acc, axis=1)
        else:
            return acc

    @triton.jit
    def _init_kernel(lp_ptr, ks_ptr, kl_ptr, lpar_ptr, lr_ptr, ls_ptr, size_ptr, L: tl.constexpr, K: tl.constexpr,
                     KP: tl.constexpr, BP: tl.constexpr):
        # every kernel here: program (i, c) works on slot c, whose inputs [L, K], scratch [L, BP] (ckey [RP],
        # node_of / gkey [L * BP], inv [N]) and outputs [N] sit at c times their sizes; the tables, cnt and the
        # flag are one for all slots. The single build is grid (n, 1): the same compiled kernels.
        c = tl.program_id(1)
        S = L * BP
        _depth_one(lp_ptr + c * (L * K), ks_ptr + c * S, kl_ptr + c * S, lpar_ptr + c * S, lr_ptr + c * S,
                   ls_ptr + c * S, size_ptr + c * S, K, KP)

    @triton.jit
    def _keys_kernel(regf_ptr, regr_ptr, ks_ptr, kl_ptr, lp_ptr, ckey_ptr, d, L: tl.constexpr,
                     K: tl.constexpr, RP: tl.constexpr, BP: tl.constexpr, TB: tl.constexpr, BI: tl.constexpr):
        """Depth d's candidate keys, written once to a contiguous buffer (keys_first)."""
        c = tl.program_id(1)
        ks_ptr += c * (L * BP)
        kl_ptr += c * (L * BP)
        lp_ptr += c * (L * K)
        ckey_ptr += c * RP
        i = tl.program_id(0) * BI + tl.arange(0, BI)
        key, _, _, _ = _candidates(d, i, regf_ptr, regr_ptr, ks_ptr, kl_ptr, lp_ptr, K, RP, BP, TB)
        tl.store(ckey_ptr + i, key, mask=i < RP)

    @triton.jit
    def _rank_kernel(regf_ptr, regr_ptr, ks_ptr, kl_ptr, lp_ptr, bndf_ptr, bndr_ptr, ktie_ptr, flag_ptr, ckey_ptr, d, Fd,
                     L: tl.constexpr, K: tl.constexpr, RP: tl.constexpr, BP: tl.constexpr, TB: tl.constexpr,
                     BI: tl.constexpr, BJ: tl.constexpr, KEYS: tl.constexpr, ONCE: tl.constexpr = False):
        """Depth d: each candidate's rank = number of smaller keys; the first Fd are kept, in key order.
        The keys compared against are rebuilt per column block from the tables, or (KEYS) read from the
        buffer _keys_kernel wrote. ONCE: the comparisons add up elementwise and reduce after the loop
        (`_count_smaller`)."""
        c = tl.program_id(1)
        ks_ptr += c * (L * BP)
        kl_ptr += c * (L * BP)
        ktie_ptr += c * (L * BP)
        lp_ptr += c * (L * K)
        ckey_ptr += c * RP
        i = tl.program_id(0) * BI + tl.arange(0, BI)
        key, score, tie, valid = _candidates(d, i, regf_ptr, regr_ptr, ks_ptr, kl_ptr, lp_ptr, K, RP, BP, TB)
        acc = tl.zeros([BI, BJ] if ONCE else [BI], tl.int32)
        for j0 in range(0, RP, BJ):
            j = j0 + tl.arange(0, BJ)
            if KEYS:
                kj = tl.load(ckey_ptr + j, mask=j < RP, other=9223372036854775807)
            else:
                kj, _, _, _ = _candidates(d, j, regf_ptr, regr_ptr, ks_ptr, kl_ptr, lp_ptr, K, RP, BP, TB)
            acc = _count_smaller(acc, kj, key, ONCE)
        rank = _counted(acc, ONCE)
        kept = valid & (rank < Fd)
        tl.store(ks_ptr + d * BP + rank, score, mask=kept)
        tl.store(ktie_ptr + d * BP + rank, tie, mask=kept)
        # certificate (by the program holding the worst kept key): it beats every excluded row's best key
        worst = tl.max(tl.where(kept & (rank == Fd - 1), key, -1), axis=0)
        if worst >= 0:
            if worst > _boundary_min(d, bndf_ptr, bndr_ptr, ks_ptr, kl_ptr, lp_ptr, K, BP, TB):
                tl.atomic_add(flag_ptr, 1)

    @triton.jit
    def _lex_kernel(ks_ptr, ktie_ptr, kl_ptr, lpar_ptr, lr_ptr, ls_ptr, size_ptr, d, Fd,
                    L: tl.constexpr, K: tl.constexpr, BP: tl.constexpr, BI: tl.constexpr, BJ: tl.constexpr):
        """Depth d: each kept prefix's lexicographic position = number of kept ties smaller than its own."""
        c = tl.program_id(1)
        S = L * BP
        ks_ptr += c * S
        ktie_ptr += c * S
        kl_ptr += c * S
        lpar_ptr += c * S
        lr_ptr += c * S
        ls_ptr += c * S
        size_ptr += c * S
        j = tl.program_id(0) * BI + tl.arange(0, BI)
        m = j < Fd
        t = tl.load(ktie_ptr + d * BP + j, mask=m, other=9223372036854775807)
        pos = tl.zeros([BI], tl.int32)
        for q0 in range(0, BP, BJ):
            q = q0 + tl.arange(0, BJ)
            tq = tl.load(ktie_ptr + d * BP + q, mask=q < Fd, other=9223372036854775807)
            pos += tl.sum((tq[None, :] < t[:, None]).to(tl.int32), axis=1)
        tl.store(kl_ptr + d * BP + j, pos, mask=m)
        tl.store(lpar_ptr + d * BP + pos, (t // K).to(tl.int32), mask=m)
        tl.store(lr_ptr + d * BP + pos, (t % K).to(tl.int32), mask=m)
        tl.store(ls_ptr + d * BP + pos, tl.load(ks_ptr + d * BP + j, mask=m, other=0.0), mask=m)
        tl.store(size_ptr + d * BP + pos, tl.full([BI], 1, tl.int32), mask=m)

    @triton.jit
    def _preorder_kernel(cnt_ptr, lpar_ptr, size_ptr, pre_ptr, L: tl.constexpr, BP: tl.constexpr):
        """One block per slot: subtree sizes and pre-order indices (the one-block kernel's own code)."""
        c = tl.program_id(1)
        S = L * BP
        _sizes_and_preorder(cnt_ptr, lpar_ptr + c * S, size_ptr + c * S, pre_ptr + c * S, L, BP)

    @triton.jit
    def _gkey(g, cnt_ptr, ls_ptr, pre_ptr, L: tl.constexpr, BP: tl.constexpr, GB: tl.constexpr):
        gd = g // BP
        valid = (gd < L) & (g % BP < tl.load(cnt_ptr + gd, mask=gd < L, other=0))
        sc = tl.load(ls_ptr + g, mask=valid, other=0.0)
        pr = tl.load(pre_ptr + g, mask=valid, other=0)
        return tl.where(valid, (_desc(sc) << GB) | pr.to(tl.int64), 9223372036854775807), valid

    @triton.jit
    def _gkeys_kernel(cnt_ptr, ls_ptr, pre_ptr, gkey_ptr, L: tl.constexpr, BP: tl.constexpr, GB: tl.constexpr,
                      BI: tl.constexpr):
        """Every kept node's (score, pre-order) key, written once to a contiguous buffer (keys_first)."""
        c = tl.program_id(1)
        S = L * BP
        ls_ptr += c * S
        pre_ptr += c * S
        gkey_ptr += c * S
        g = tl.program_id(0) * BI + tl.arange(0, BI)
        key, _ = _gkey(g, cnt_ptr, ls_ptr, pre_ptr, L, BP, GB)
        tl.store(gkey_ptr + g, key, mask=g < L * BP)

    @triton.jit
    def _pop_rank_kernel(cnt_ptr, ls_ptr, pre_ptr, node_of_ptr, inv_ptr, gkey_ptr,
                       L: tl.constexpr, BP: tl.constexpr, GB: tl.constexpr, N: tl.constexpr,
                       BI: tl.constexpr, BJ: tl.constexpr, KEYS: tl.constexpr, ONCE: tl.constexpr = False):
        """Every kept node's rank by (score, pre-order); the best N get node numbers 1..N in pop order (ONCE: as
        _rank_kernel's)."""
        c = tl.program_id(1)
        S = L * BP
        ls_ptr += c * S
        pre_ptr += c * S
        node_of_ptr += c * S
        gkey_ptr += c * S
        inv_ptr += c * N
        g = tl.program_id(0) * BI + tl.arange(0, BI)
        key, valid = _gkey(g, cnt_ptr, ls_ptr, pre_ptr, L, BP, GB)
        acc = tl.zeros([BI, BJ] if ONCE else [BI], tl.int32)
        for h0 in range(0, L * BP, BJ):
            h = h0 + tl.arange(0, BJ)
            if KEYS:
                kh = tl.load(gkey_ptr + h, mask=h < L * BP, other=9223372036854775807)
            else:
                kh, _ = _gkey(h, cnt_ptr, ls_ptr, pre_ptr, L, BP, GB)
            acc = _count_smaller(acc, kh, key, ONCE)
        rank = _counted(acc, ONCE)
        chosen = valid & (rank < N)
        tl.store(node_of_ptr + g, rank + 1, mask=chosen)
        tl.store(inv_ptr + rank, g, mask=chosen)

    @triton.jit
    def _emit_kernel(inv_ptr, node_of_ptr, lpar_ptr, lr_ptr, tok_ptr, tok_out, par_out, dep_out,
                     L: tl.constexpr, K: tl.constexpr, BP: tl.constexpr, N: tl.constexpr, BI: tl.constexpr):
        c = tl.program_id(1)
        S = L * BP
        inv_ptr += c * N
        node_of_ptr += c * S
        lpar_ptr += c * S
        lr_ptr += c * S
        tok_ptr += c * (L * K)
        tok_out += c * N
        par_out += c * N
        dep_out += c * N
        p = tl.program_id(0) * BI + tl.arange(0, BI)
        m = p < N
        g = tl.load(inv_ptr + p, mask=m, other=0)
        _emit_nodes(p, g, m, node_of_ptr, lpar_ptr, lr_ptr, tok_ptr, tok_out, par_out, dep_out, K, BP)


def _grid_scratch(b, L: int, V: int, budget: int, device, keys_first: bool, slots: int = 0) -> None:
    """The grid builder's shapes and scratch on `b` (pruned_scratch's, plus ktie, node_of, inv and the key buffers),
    one set per slot where slots > 0 ([slots, ...]; the tables and the flag stay one for all)."""
    pruned_scratch(b, L, V, budget, device, lambda r: -(-max(1, r) // BJ) * BJ, slots=slots)
    if 32 + b.TB > 63 or 32 + b.GB > 63:
        raise ValueError(f"budget {budget} is too large for the grid tree kernels")
    BP, lead = b.BP, ((slots,) if slots else ())
    b.keys_first, b._rows = keys_first, ROWS
    # the counting loops' columns a step, the lex loop's, and ONCE: constants unless an A/B names them
    # (kernels/experimental.py); gpu/_probe.py sets them on a builder
    b.bj = experimental.knob("GRID_KEYS_BJ", BJ_KEYS, KEYS_WIDTHS) if keys_first else BJ
    b._lex_bj = experimental.knob("GRID_LEX_BJ", BJ, LEX_WIDTHS)
    b._once = experimental.enabled("grid-once")
    b.ktie = torch.zeros(*lead, L, BP, dtype=torch.long, device=device)
    b.node_of = torch.zeros(*lead, L * BP, dtype=torch.int32, device=device)
    b.inv = torch.zeros(*lead, b.N, dtype=torch.int32, device=device)
    b.ckey = torch.zeros(*lead, b.RP if keys_first else 1, dtype=torch.long, device=device)
    b.gkey = torch.zeros(*lead, L * BP if keys_first else 1, dtype=torch.long, device=device)
    b.pre_warps = 4 if BP <= 1024 else 8


def _launch_grid(b, C: int, lp, tok, tok_out, par_out, dep_out) -> None:
    """The grid build's ~2L + 4 launches, each over (programs, C): slot c's tree from its [L, K] lp / tok into its
    own scratch and [N] outputs (C = 1: the single build)."""
    L, K, BP, RP, TB = b.L, b.K, b.BP, b.RP, b.TB
    launch(_init_kernel, (1, C), lp, b.ks, b.kl, b.lpar, b.lr, b.ls, b.size, L=L, K=K, KP=_pow2(K), BP=BP)
    keys, bj, rows, once = b.keys_first, b.bj, b._rows, b._once
    for d in range(1, L):
        R, Fd = b.R[d], b.counts[d]
        if keys:
            launch(_keys_kernel, (triton.cdiv(RP, BI), C), b.regf, b.regr, b.ks, b.kl, lp, b.ckey, d,
                   L=L, K=K, RP=RP, BP=BP, TB=TB, BI=BI)
        launch(_rank_kernel, (triton.cdiv(R, rows), C), b.regf, b.regr, b.ks, b.kl, lp, b.bndf,
               b.bndr, b.ktie, b.flag, b.ckey, d, Fd, L=L, K=K, RP=RP, BP=BP, TB=TB,
               BI=rows, BJ=bj, KEYS=keys, ONCE=once)
        launch(_lex_kernel, (triton.cdiv(Fd, rows), C), b.ks, b.ktie, b.kl, b.lpar, b.lr, b.ls,
               b.size, d, Fd, L=L, K=K, BP=BP, BI=rows, BJ=b._lex_bj)
    launch(_preorder_kernel, (1, C), b.cnt, b.lpar, b.size, b.pre, L=L, BP=BP, num_warps=b.pre_warps)
    G = L * BP
    if keys:
        launch(_gkeys_kernel, (triton.cdiv(G, BI), C), b.cnt, b.ls, b.pre, b.gkey, L=L, BP=BP, GB=b.GB, BI=BI)
    launch(_pop_rank_kernel, (triton.cdiv(G, rows), C), b.cnt, b.ls, b.pre, b.node_of, b.inv, b.gkey,
           L=L, BP=BP, GB=b.GB, N=b.N, BI=rows, BJ=bj, KEYS=keys, ONCE=once)
    launch(_emit_kernel, (triton.cdiv(b.N, BI), C), b.inv, b.node_of, b.lpar, b.lr, tok, tok_out,
           par_out, dep_out, L=L, K=K, BP=BP, N=b.N, BI=BI)


class GridTreeBuilder:
    """Drop-in for StaticTreeBuilder on CUDA: __call__(draft_logits [L, V]) -> (token_ids, parents, depths)
    [N] long. `flag` ([1] int32, device) counts failed pruning certificates since the last reset.

    keys_first: write each depth's candidate keys (and the final (score, pre-order) keys) to a buffer
    in one extra launch, so the counting loops read contiguous keys in wider blocks (BJ_KEYS) instead
    of rebuilding them from five table lookups per block: more launches, shorter loops.
    `_rows`: items each program of the counting kernels ranks (ROWS; gpu/_probe.py varies it)."""

    name = "triton-grid"

    def __init__(self, L: int, V: int, budget: int, device, keys_first: bool = False):
        _grid_scratch(self, L, V, budget, device, keys_first)
        if keys_first:
            self.name = "triton-grid-keys"

    def __call__(self, draft_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        lp, tok, (tok_out, par_out, dep_out) = pruned_inputs(self, draft_logits)
        _launch_grid(self, 1, lp, tok, tok_out, par_out, dep_out)
        return tok_out, par_out, dep_out


class SlottedGridBuilder:
    """The grid build over the slots of a batched round: __call__(draft_logits [C, L, V]), C <= slots ->
    batch_tree.BatchTrees ([C, N] token_ids, parents, depths), row c = slot c's tree. Every launch of the single
    build runs once for all C slots, over a second grid axis (program (i, c) on slot c's own log-probs, scratch and
    outputs, preallocated for `slots`: fixed shapes, so one CUDA graph per bucket replays it); the compiled kernels
    are the single build's (GridTreeBuilder; C = 1 is its launch), so a batched loop whose single loop builds with
    the grid kernels compiles nothing more for its batched rounds. The log-probs and ids are `exact.logprobs`
    (batch_tree.BatchTreeBuilder: each slot's normaliser on its own [L, V]), as tree_block.SlottedTreeBuilder's,
    so a certified tree is the exact batched builder's row for row; `flag` counts failed certificates of every
    slot since the last reset (any slot failing makes the caller redo the round with `exact`)."""

    name = "triton-grid-slotted"

    def __init__(self, L: int, V: int, budget: int, device, slots: int, exact=None, keys_first: bool = False):
        _grid_scratch(self, L, V, budget, device, keys_first, slots=max(slots, 1))
        self.slots = slots
        self.exact = slotted_exact(self, slots, exact)
        if keys_first:
            self.name = "triton-grid-keys-slotted"

    def __call__(self, draft_logits: torch.Tensor):
        from ddtree_bench.engine.gpu.batch_tree import BatchTrees

        C, lp, tok, outs = slotted_inputs(self, draft_logits)
        _launch_grid(self, C, lp, tok, *outs)
        return BatchTrees(*outs)
