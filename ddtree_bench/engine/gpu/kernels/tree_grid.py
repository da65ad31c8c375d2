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
Scratch lives in preallocated device buffers; every launch has fixed shapes (graph-capturable).
Needs Triton and a CUDA device (or Triton's CPU interpreter, which the tests use).
"""

from __future__ import annotations

import torch

from ddtree_bench.engine.gpu.kernels.common import _pow2, tl, triton
from ddtree_bench.engine.gpu.kernels.tree_pruned import pruned_inputs, pruned_scratch
from ddtree_bench.engine.gpu.kernels.warm import launch

BI = 64  # items per program of the one-pass kernels (keys, emit)
ROWS = 8  # items ranked per program of the counting kernels (rank, lex, select): fewer rows, more programs (docs/gpu-performance.md)
BJ = 64  # columns (items compared against) per inner step
BJ_KEYS = 128  # the same, reading precomputed keys (keys_first)

if triton is not None:
    from ddtree_bench.engine.gpu.kernels.common import _desc
    from ddtree_bench.engine.gpu.kernels.tree_pruned import _boundary_min, _candidates, _depth_one, _emit_nodes, \
        _sizes_and_preorder

    @triton.jit
    def _init_kernel(lp_ptr, ks_ptr, kl_ptr, lpar_ptr, lr_ptr, ls_ptr, size_ptr, K: tl.constexpr, KP: tl.constexpr):
        _depth_one(lp_ptr, ks_ptr, kl_ptr, lpar_ptr, lr_ptr, ls_ptr, size_ptr, K, KP)

    @triton.jit
    def _keys_kernel(regf_ptr, regr_ptr, ks_ptr, kl_ptr, lp_ptr, ckey_ptr, d,
                     K: tl.constexpr, RP: tl.constexpr, BP: tl.constexpr, TB: tl.constexpr, BI: tl.constexpr):
        """Depth d's candidate keys, written once to a contiguous buffer (keys_first)."""
        i = tl.program_id(0) * BI + tl.arange(0, BI)
        key, _, _, _ = _candidates(d, i, regf_ptr, regr_ptr, ks_ptr, kl_ptr, lp_ptr, K, RP, BP, TB)
        tl.store(ckey_ptr + i, key, mask=i < RP)

    @triton.jit
    def _rank_kernel(regf_ptr, regr_ptr, ks_ptr, kl_ptr, lp_ptr, bndf_ptr, bndr_ptr, ktie_ptr, flag_ptr, ckey_ptr, d, Fd,
                     K: tl.constexpr, RP: tl.constexpr, BP: tl.constexpr, TB: tl.constexpr,
                     BI: tl.constexpr, BJ: tl.constexpr, KEYS: tl.constexpr):
        """Depth d: each candidate's rank = number of smaller keys; the first Fd are kept, in key order.
        The keys compared against are rebuilt per column block from the tables, or (KEYS) read from the
        buffer _keys_kernel wrote."""
        i = tl.program_id(0) * BI + tl.arange(0, BI)
        key, score, tie, valid = _candidates(d, i, regf_ptr, regr_ptr, ks_ptr, kl_ptr, lp_ptr, K, RP, BP, TB)
        rank = tl.zeros([BI], tl.int32)
        for j0 in range(0, RP, BJ):
            j = j0 + tl.arange(0, BJ)
            if KEYS:
                kj = tl.load(ckey_ptr + j, mask=j < RP, other=9223372036854775807)
            else:
                kj, _, _, _ = _candidates(d, j, regf_ptr, regr_ptr, ks_ptr, kl_ptr, lp_ptr, K, RP, BP, TB)
            rank += tl.sum((kj[None, :] < key[:, None]).to(tl.int32), axis=1)
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
                    K: tl.constexpr, BP: tl.constexpr, BI: tl.constexpr, BJ: tl.constexpr):
        """Depth d: each kept prefix's lexicographic position = number of kept ties smaller than its own."""
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
        """One block: subtree sizes and pre-order indices (the one-block kernel's own code)."""
        _sizes_and_preorder(cnt_ptr, lpar_ptr, size_ptr, pre_ptr, L, BP)

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
        g = tl.program_id(0) * BI + tl.arange(0, BI)
        key, _ = _gkey(g, cnt_ptr, ls_ptr, pre_ptr, L, BP, GB)
        tl.store(gkey_ptr + g, key, mask=g < L * BP)

    @triton.jit
    def _select_kernel(cnt_ptr, ls_ptr, pre_ptr, node_of_ptr, inv_ptr, gkey_ptr,
                       L: tl.constexpr, BP: tl.constexpr, GB: tl.constexpr, N: tl.constexpr,
                       BI: tl.constexpr, BJ: tl.constexpr, KEYS: tl.constexpr):
        """Every kept node's rank by (score, pre-order); the best N get node numbers 1..N in pop order."""
        g = tl.program_id(0) * BI + tl.arange(0, BI)
        key, valid = _gkey(g, cnt_ptr, ls_ptr, pre_ptr, L, BP, GB)
        rank = tl.zeros([BI], tl.int32)
        for h0 in range(0, L * BP, BJ):
            h = h0 + tl.arange(0, BJ)
            if KEYS:
                kh = tl.load(gkey_ptr + h, mask=h < L * BP, other=9223372036854775807)
            else:
                kh, _ = _gkey(h, cnt_ptr, ls_ptr, pre_ptr, L, BP, GB)
            rank += tl.sum((kh[None, :] < key[:, None]).to(tl.int32), axis=1)
        chosen = valid & (rank < N)
        tl.store(node_of_ptr + g, rank + 1, mask=chosen)
        tl.store(inv_ptr + rank, g, mask=chosen)

    @triton.jit
    def _emit_kernel(inv_ptr, node_of_ptr, lpar_ptr, lr_ptr, tok_ptr, tok_out, par_out, dep_out,
                     K: tl.constexpr, BP: tl.constexpr, N: tl.constexpr, BI: tl.constexpr):
        p = tl.program_id(0) * BI + tl.arange(0, BI)
        m = p < N
        g = tl.load(inv_ptr + p, mask=m, other=0)
        _emit_nodes(p, g, m, node_of_ptr, lpar_ptr, lr_ptr, tok_ptr, tok_out, par_out, dep_out, K, BP)


class GridTreeBuilder:
    """Drop-in for StaticTreeBuilder on CUDA: __call__(draft_logits [L, V]) -> (token_ids, parents, depths)
    [N] long. `flag` ([1] int32, device) counts failed pruning certificates since the last reset.

    keys_first: write each depth's candidate keys (and the final (score, pre-order) keys) to a buffer
    in one extra launch, so the counting loops read contiguous keys in wider blocks (BJ_KEYS) instead
    of rebuilding them from five table lookups per block: more launches, shorter loops.
    `_rows`: items each program of the counting kernels ranks (ROWS; gpu/_probe.py varies it)."""

    name = "triton-grid"

    def __init__(self, L: int, V: int, budget: int, device, keys_first: bool = False):
        pruned_scratch(self, L, V, budget, device, lambda r: -(-max(1, r) // BJ) * BJ)
        BP = self.BP
        if 32 + self.TB > 63 or 32 + self.GB > 63:
            raise ValueError(f"budget {budget} is too large for the grid tree kernels")
        self.keys_first, self._rows = keys_first, ROWS
        if keys_first:
            self.name = "triton-grid-keys"
        self.bj = BJ_KEYS if keys_first else BJ
        self.ktie = torch.zeros(L, BP, dtype=torch.long, device=device)
        self.node_of = torch.zeros(L * BP, dtype=torch.int32, device=device)
        self.inv = torch.zeros(max(1, self.N), dtype=torch.int32, device=device)
        self.ckey = torch.zeros(self.RP if keys_first else 1, dtype=torch.long, device=device)
        self.gkey = torch.zeros(L * BP if keys_first else 1, dtype=torch.long, device=device)
        self.pre_warps = 4 if BP <= 1024 else 8

    def __call__(self, draft_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        L, K, BP, RP, TB = self.L, self.K, self.BP, self.RP, self.TB
        lp, tok, (tok_out, par_out, dep_out) = pruned_inputs(self, draft_logits)
        launch(_init_kernel, (1,), lp, self.ks, self.kl, self.lpar, self.lr, self.ls, self.size, K=K, KP=_pow2(K))
        keys, bj, rows = self.keys_first, self.bj, self._rows
        for d in range(1, L):
            R, Fd = self.R[d], self.counts[d]
            if keys:
                launch(_keys_kernel, (triton.cdiv(RP, BI),), self.regf, self.regr, self.ks, self.kl, lp, self.ckey, d,
                       K=K, RP=RP, BP=BP, TB=TB, BI=BI)
            launch(_rank_kernel, (triton.cdiv(R, rows),), self.regf, self.regr, self.ks, self.kl, lp, self.bndf,
                   self.bndr, self.ktie, self.flag, self.ckey, d, Fd, K=K, RP=RP, BP=BP, TB=TB,
                   BI=rows, BJ=bj, KEYS=keys)
            launch(_lex_kernel, (triton.cdiv(Fd, rows),), self.ks, self.ktie, self.kl, self.lpar, self.lr, self.ls,
                   self.size, d, Fd, K=K, BP=BP, BI=rows, BJ=BJ)
        launch(_preorder_kernel, (1,), self.cnt, self.lpar, self.size, self.pre, L=L, BP=BP, num_warps=self.pre_warps)
        G = L * BP
        if keys:
            launch(_gkeys_kernel, (triton.cdiv(G, BI),), self.cnt, self.ls, self.pre, self.gkey, L=L, BP=BP,
                   GB=self.GB, BI=BI)
        launch(_select_kernel, (triton.cdiv(G, rows),), self.cnt, self.ls, self.pre, self.node_of, self.inv, self.gkey,
               L=L, BP=BP, GB=self.GB, N=self.N, BI=rows, BJ=bj, KEYS=keys)
        launch(_emit_kernel, (triton.cdiv(self.N, BI),), self.inv, self.node_of, self.lpar, self.lr, tok, tok_out,
               par_out, dep_out, K=K, BP=BP, N=self.N, BI=BI)
        return tok_out, par_out, dep_out
