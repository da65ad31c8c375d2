"""Fixed-shape tree verify inputs, walk and commit bookkeeping: graph-capturable, no host syncs.

Shapes depend only on (L, budget), never on the drafter's values, so one CUDA graph per budget
replays a whole stage. Same results as tree.py / verify.py:
* `chain` is DFlash's block as a tree (the argmax chain);
* `ancestors` follows parent pointers exactly L times (the tree depth is at most L), so it needs no
  `max()` read back to the host; `verify_visible` widens it to every cache slot;
* `walk_static` returns the accepted path as one fixed-size vector (interface.WalkLayout); the
  caller moves that small vector to the host: the only sync of a round;
* `commit_static` keeps the accepted path in place (K/V, context rows, frontier, bonus).
The tree build itself is `tree_vector.StaticTreeBuilder` (the plain loop uses it too) or a Triton
builder (gpu/builders.py). Knows nothing of models, caches' owners or graphs.
"""

from __future__ import annotations

import torch

from ddtree_bench.engine.interface import WalkLayout


def chain(draft_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DFlash's block as a tree: the argmax chain, node i's parent is node i-1."""
    toks = draft_logits.argmax(dim=-1)
    ar = torch.arange(toks.numel(), device=toks.device)
    return toks, ar, ar + 1


def ancestors(parents: torch.Tensor, steps: int) -> torch.Tensor:
    """[1+N, 1+N] bool ancestor-or-self matrix (root = 0), following parent pointers `steps` times
    (steps >= the tree depth; extra steps stay on the root, which is already marked)."""
    n = parents.numel()
    dev = parents.device
    par = torch.cat([torch.zeros(1, dtype=torch.long, device=dev), parents])
    rows = torch.arange(n + 1, device=dev)
    vis = rows[:, None] == rows[None, :]
    cur = rows
    for _ in range(steps):
        cur = par[cur]
        vis.scatter_(1, cur[:, None], True)  # a scalar fill: `vis[rows, cur] = True` copies from the CPU, which capture forbids
    return vis


def verify_visible(anc: torch.Tensor, start: torch.Tensor, capacity: int) -> torch.Tensor:
    """[T, capacity] bool over every cache slot for tree tokens in slots start..start+T-1: the committed
    prefix (slots < start) plus the row's ancestors and itself; everything past the tree hidden."""
    T = anc.shape[0]
    cols = torch.arange(capacity, device=anc.device)
    rel = cols - start
    in_tree = (rel >= 0) & (rel < T)
    tree_part = anc.gather(1, rel.clamp(0, T - 1)[None, :].expand(T, capacity)) & in_tree[None, :]
    return tree_part | (cols < start)[None, :]


def walk_static(ids: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, anc: torch.Tensor, post: torch.Tensor,
                L: int) -> torch.Tensor:
    """The tree walk as fixed-size tensors. ids [T] (root first), parents/depths [N] (non-root),
    anc [T, T], post [T] = the target's pick at every position. Returns the walk result vector of
    WalkLayout(L): [a | node index at depth 0..L (unused depths 0) | token at depth 0..L | bonus]."""
    T = ids.numel()
    dev = ids.device
    zero = torch.zeros(1, dtype=torch.long, device=dev)
    par = torch.cat([zero, parents])
    dep = torch.cat([zero, depths])
    rows = torch.arange(T, device=dev)
    match = (ids == post[par]) | (rows == 0)            # the root "matches" by definition
    ok = ~(anc & ~match[None, :]).any(dim=1)            # a node is accepted iff its whole path matches
    idx = torch.zeros(L + 1, dtype=torch.long, device=dev).scatter_add_(0, dep, torch.where(ok, rows, 0))
    a = ok.sum().reshape(1)
    bonus = post.gather(0, idx.gather(0, a - 1))
    return torch.cat([a, idx, ids.gather(0, idx), bonus])   # WalkLayout order: COUNT, nodes, tokens, bonus


def commit_sources(walked: torch.Tensor, layout: WalkLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """From a walk result: (a [1], source row for each kept slot 0..L): accepted node i for i < a,
    else i itself (a no-op move)."""
    L = layout.L
    a = walked[layout.COUNT : layout.COUNT + 1]
    idx = walked[layout.nodes : layout.nodes + L + 1]
    ar = torch.arange(L + 1, device=walked.device)
    return a, torch.where(ar < a, idx, ar)


def commit_static(walked: torch.Tensor, layout: WalkLayout, start: torch.Tensor, ctx_start: torch.Tensor,
                  bonus: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hidden: torch.Tensor, ctx: torch.Tensor) -> None:
    """Commit a walked round in place. walked: the walk result (with the builder's certificate flag
    when `layout.guard`); k, v [layers, Hkv, S, D] cache; hidden [T, C] the verify rows' context
    features; ctx [L+1, C]. Moves the accepted path's K/V rows to slots start..start+L (the others
    move onto themselves), gathers its hidden rows into ctx, sets ctx_start = start, advances start
    by a and stores the bonus. With guard and a raised flag nothing changes (a counts as 0)."""
    L = layout.L
    keep = walked[layout.flag : layout.flag + 1] == 0 if layout.guard else None   # [1] bool: the tree is certified
    a, src = commit_sources(walked if keep is None else torch.cat([walked[:1] * keep, walked[1:]]), layout)
    ar = torch.arange(L + 1, device=walked.device)
    dst, srcs = start + ar, start + src
    k.index_copy_(2, dst, k.index_select(2, srcs))
    v.index_copy_(2, dst, v.index_select(2, srcs))
    rows = hidden.index_select(0, src.clamp(max=hidden.shape[0] - 1))
    new_bonus = walked[layout.bonus : layout.bonus + 1]
    if keep is None:
        ctx.copy_(rows)
        ctx_start.copy_(start)
        bonus.copy_(new_bonus)
    else:
        ctx.copy_(torch.where(keep, rows, ctx))
        ctx_start.copy_(torch.where(keep[0], start, ctx_start))
        bonus.copy_(torch.where(keep, new_bonus, bonus))
    start.add_(a.view(()))
