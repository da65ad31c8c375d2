"""The paper's Algorithm 1 written plainly: the speed reference the engine's CPU tree build races.

Per depth `torch.topk` of log_softmax (K = min(B, V) per depth, equal logits in whatever order topk
leaves them), a Python heap of (-score, depth, rank, parent, parent score) popped B times, then the
O(B^2) row-copy visibility matrix (`tree.ancestor_matrix_slow`) when asked. It is what one would
write from the paper, and only a yardstick: its tie order is not the engine's exact rule, so it is
never compared token for token. Knows nothing of models; CPU tensors in, token ids out.
"""

from __future__ import annotations

import heapq

import torch


def plain_algorithm1(logits: torch.Tensor, budget: int, visibility: bool = False) -> list[int]:
    """Token ids of the B-node tree in pop order (parents and the visibility matrix built, not returned)."""
    from ddtree_bench.engine.tree import ancestor_matrix_slow

    L, V = logits.shape
    K = min(budget, V)
    lp, tok = torch.topk(torch.log_softmax(logits.float(), dim=-1), K, dim=-1)
    lp, tok = lp.tolist(), tok.tolist()
    heap = [(-lp[0][0], 1, 0, 0, 0.0)]
    tokens, parents = [], []
    while heap and len(tokens) < budget:
        neg, d, r, parent, parent_score = heapq.heappop(heap)
        tokens.append(tok[d - 1][r])
        parents.append(parent)
        if r + 1 < K:
            heapq.heappush(heap, (-(parent_score + lp[d - 1][r + 1]), d, r + 1, parent, parent_score))
        if d < L:
            heapq.heappush(heap, (neg - lp[d][0], d + 1, 0, len(tokens), -neg))
    if visibility:
        ancestor_matrix_slow(torch.tensor(parents, dtype=torch.long))
    return tokens
