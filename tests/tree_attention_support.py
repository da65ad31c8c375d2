"""Shared by the attention kernel tests (tests/engine/gpu/test_attention_triton.py, test_batch_attention_triton.py):
random trees in the layout the tree attention kernel reads (parents, depths, the path table)."""

from __future__ import annotations

import torch


def random_tree(N: int, L: int, seed: int, chain: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """parents [N] (1-based, root 0) with every parent before its child and depth <= L; depths [N]; path [1+N, L+1]
    (row t: the node at each depth 0..depth(t), the rest -1: never read). chain: the chance that a node's parent
    is the node just before it (when that one is shallower than L), else a uniform pick: deep trees."""
    g = torch.Generator().manual_seed(seed)
    par, dep = [], [0]
    for i in range(1, N + 1):
        choices = [j for j in range(i) if dep[j] < L]
        if chain > 0 and dep[i - 1] < L and float(torch.rand(1, generator=g)) < chain:
            p = i - 1
        else:
            p = choices[int(torch.randint(len(choices), (1,), generator=g))]
        par.append(p)
        dep.append(dep[p] + 1)
    path = torch.full((N + 1, L + 1), -1, dtype=torch.long)
    for t in range(N + 1):
        node = t
        for d in range(dep[t], -1, -1):
            path[t, d] = node
            node = par[node - 1] if node else 0
    return torch.tensor(par, dtype=torch.long), torch.tensor(dep[1:], dtype=torch.long), path
