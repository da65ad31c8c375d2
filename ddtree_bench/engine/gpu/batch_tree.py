"""The batched exact DDTree tree build: every slot's tree from draft logits [C, L, V] in one call.

`BatchTreeBuilder(L, V, budget, device)(draft_logits [C, L, V])` returns `BatchTrees`: token_ids,
parents (1-based, 0 = root) and depths, each [C, N], row c equal to what
`tree_vector.StaticTreeBuilder(L, V, budget)` builds from draft_logits[c] (same nodes, same pop order,
same tie rule: score desc, then the rank tuple asc). It is StaticTreeBuilder's algorithm with a
leading batch dimension on every tensor: the per-depth top-K, per depth the top F_d of the previous
depth's kept prefixes extended by K tokens (one topk over [C, F_{d-1} * K] int64 keys), the pre-order
tie ranks (scatter_add / gather / cumsum / cummax along dim 1), the global top N per slot. Every
comparison is on exact int64 keys and the fp32 scores are elementwise sums, so the batch changes no
bit; the one float sum, the log-softmax normaliser's, is taken per slot on that slot's own
contiguous [L, V] block (tree_vector.log_normalisers: the same op on the same shape as the per-slot
builder, so the same bits on any device, where one reduction over [C * L, V] may split its sums
differently; its max and elementwise steps run once over every slot, in one Triton pass on CUDA where
kernels/normalisers.py gives their bits for `logits_dtype`).
The per-depth top-K token ids come from one exact selection over the C * L rows: the Triton
selection of kernels/topk.py on CUDA (`select="auto"`, bit for bit the same ids; `topk_ids_fused`, which
skips the log-probs), or one torch.topk
over the (logit desc, id asc) keys (`select="torch"`, and on CPU). Shapes depend only on
(C, L, V, budget), so one CUDA graph per (bucket, budget) replays a whole batched build.
`per_slot` is the slow obvious twin (StaticTreeBuilder slot by slot). Knows nothing of models,
caches, rounds or graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ddtree_bench.engine.tree_vector import StaticTreeBuilder, _desc_key, fp32_logits, logprobs_at

SELECTS = ("auto", "torch", "triton")


@dataclass(frozen=True)
class BatchTrees:
    """C trees of N non-root nodes each, in pop order: token_ids, parents (1-based, 0 = root), depths, all [C, N]."""

    token_ids: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor

    def slot(self, c: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Slot c's tree as StaticTreeBuilder returns it: (token_ids, parents, depths), views [N]."""
        return self.token_ids[c], self.parents[c], self.depths[c]

    def slots(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        return [self.slot(c) for c in range(self.token_ids.shape[0])]


def _rank_of(order: torch.Tensor) -> torch.Tensor:
    """Inverse permutation per row: rank[c, order[c, i]] = i."""
    ar = torch.arange(order.shape[1], device=order.device).expand_as(order)
    return torch.empty_like(order).scatter_(1, order, ar)


def preorder(parent: list, lexrank: list[torch.Tensor]) -> list[torch.Tensor]:
    """tree_vector.preorder per row: the pre-order index of every kept prefix [C, F_d] in its slot's trie.
    parent[d][c, i]: index of entry i's parent among depth d-1's entries of slot c (unused at d = 0);
    lexrank[d][c]: lexicographic rank of each entry among its slot's depth-d entries."""
    L = len(lexrank)
    sizes = [torch.ones_like(r) for r in lexrank]
    for d in range(L - 1, 0, -1):
        sizes[d - 1] = sizes[d - 1].scatter_add(1, parent[d], sizes[d])
    pre: list[torch.Tensor] = []
    for d in range(L):
        order = torch.argsort(lexrank[d], dim=1)                      # per slot: grouped by parent, r ascending
        sz = sizes[d].gather(1, order)
        before = sz.cumsum(1) - sz
        if d == 0:
            earlier, base = before, 0
        else:
            par_sorted = parent[d].gather(1, order)
            first = torch.ones_like(par_sorted, dtype=torch.bool)
            first[:, 1:] = par_sorted[:, 1:] != par_sorted[:, :-1]
            earlier = before - torch.cummax(torch.where(first, before, torch.zeros_like(before)), 1).values
            base = pre[d - 1].gather(1, par_sorted) + 1
        pre.append(torch.empty_like(sz).scatter_(1, order, base + earlier))
    return pre


class BatchTreeBuilder:
    """StaticTreeBuilder over a leading batch dimension (module docstring); any C per call."""

    name = "torch-batched"

    def __init__(self, L: int, V: int, budget: int, device, select: str = "auto",
                 logits_dtype: torch.dtype | None = None):
        if select not in SELECTS:
            raise ValueError(f"unknown top-K selection {select!r}: {' | '.join(SELECTS)}")
        self.one = StaticTreeBuilder(L, V, budget, device)   # the shape constants, its checks, and the twin
        self.L, self.V, self.budget = L, V, budget
        self.K, self.counts, self.N = self.one.K, self.one.counts, self.one.N
        dev = torch.device(device)
        self.triton = select == "triton" or (select == "auto" and dev.type == "cuda" and _triton_ok(self.K, V))
        # the log-probs' normaliser steps in one Triton pass (kernels/normalisers.py) for draft logits of
        # logits_dtype, where that pass gives the twin's bits on this device (checked once per process)
        self.fused_dtype = None
        if self.triton and dev.type == "cuda" and logits_dtype is not None:
            from ddtree_bench.engine.gpu.kernels import normalisers

            self.fused_dtype = logits_dtype if normalisers.exact_here(str(dev), logits_dtype) else None

    def per_slot(self, draft_logits: torch.Tensor) -> BatchTrees:
        """The slow obvious twin: StaticTreeBuilder on each slot's [L, V], stacked."""
        trees = [self.one(x) for x in draft_logits]
        return BatchTrees(*(torch.stack(t) for t in zip(*trees)))

    def logprobs(self, draft_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per slot and depth the top K: (logprobs [C, L, K] fp32, token ids [C, L, K]), as topk_logprobs per slot."""
        C, L, V = draft_logits.shape
        rows = draft_logits.reshape(C * L, V)
        if self.triton:
            from ddtree_bench.engine.gpu.kernels.topk import topk_ids_fused

            ids = topk_ids_fused(rows, self.K)   # ids only: log-probs over [C * L, V] would not be each slot's bits
        else:
            logits = fp32_logits(rows)
            bits = max(1, (V - 1).bit_length())
            key = (_desc_key(logits) << bits) | torch.arange(V, device=logits.device)
            ids = torch.topk(key, self.K, dim=-1, largest=False, sorted=True).indices
        ids = ids.view(C, L, self.K)
        if draft_logits.dtype == self.fused_dtype:   # the same bits, the elementwise passes in one launch
            from ddtree_bench.engine.gpu.kernels import normalisers

            return normalisers.logprobs_at(draft_logits, ids), ids
        return logprobs_at(fp32_logits(draft_logits), ids), ids   # each slot's normaliser on its own [L, V]: its bits

    def __call__(self, draft_logits: torch.Tensor) -> BatchTrees:
        if draft_logits.dim() != 3 or draft_logits.shape[1:] != (self.L, self.V):
            raise ValueError(f"draft logits must be [C, {self.L}, {self.V}], got {list(draft_logits.shape)}")
        one, K = self.one, self.K
        C = draft_logits.shape[0]
        lp, tok = self.logprobs(draft_logits)
        arK = one.arK.expand(C, K)
        scores, parent, rank, lexrank = [lp[:, 0]], [None], [arK], [arK]
        for d in range(1, self.L):
            cand = (scores[-1][:, :, None] + lp[:, d, None, :]).flatten(1)           # [C, F * K]
            tie = (lexrank[-1][:, :, None] * K + one.arK).flatten(1)
            key = (_desc_key(cand) << one.tie_bits) | tie
            keep = torch.topk(key, self.counts[d], dim=1, largest=False, sorted=True).indices
            scores.append(cand.gather(1, keep))
            parent.append(keep // K)
            rank.append(keep % K)
            lexrank.append(_rank_of(torch.argsort(tie.gather(1, keep), dim=1)))
        return self._assemble(tok, scores, parent, rank, lexrank)

    def _assemble(self, tok, scores, parent, rank, lexrank) -> BatchTrees:
        """Per slot the global top N of every depth's kept prefixes, numbered in pop order."""
        one = self.one
        S, P = torch.cat(scores, dim=1), torch.cat(preorder(parent, lexrank), dim=1)
        C = S.shape[0]
        gkey = (_desc_key(S) << one.gbits) | P
        chosen = torch.topk(gkey, self.N, dim=1, largest=False, sorted=True).indices          # [C, N]
        node_of = torch.zeros_like(S, dtype=torch.long).scatter_(1, chosen, one.node_ids.expand(C, -1))
        d = one.depth[chosen]
        flat_parent = torch.cat([one.zeros0.expand(C, -1)] + parent[1:], dim=1).gather(1, chosen)
        up = node_of.gather(1, flat_parent + one.offsets[(d - 2).clamp(min=0)])
        parents = torch.where(d > 1, up, torch.zeros_like(d))
        r = torch.cat(rank, dim=1).gather(1, chosen)
        token_ids = tok.flatten(1).gather(1, (d - 1) * self.K + r)
        return BatchTrees(token_ids, parents, d)


def _triton_ok(K: int, V: int) -> bool:
    """Whether the Triton top-K selection applies (Triton present, K within its chunk, K <= V)."""
    try:
        from ddtree_bench.engine.gpu.kernels.topk import MAX_K, triton
    except ImportError:
        return False
    return triton is not None and K <= min(MAX_K, V)
