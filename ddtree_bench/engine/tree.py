"""DDTree draft trees: build the B most probable prefixes, and compile them into verify inputs.

The drafter gives L = block_size - 1 per-depth marginals q_1..q_L (raw logits [L, V]). A node is a
prefix u = (u_1..u_d); its score is the sum of log-probabilities along its path,
s(u) = ((lp_1[u_1] + lp_2[u_2]) + ...) accumulated from depth 1 down in fp32. The tree for budget B
is the B highest-scoring prefixes; because a child never scores above its parent, that set is
prefix-closed (DDTree paper, Prop. 2). Only the top K = min(B, V) tokens per depth can appear
(Lemma 1). Ties go to the lexicographically smaller tuple of 0-based ranks, e.g. (0,) < (0,0) <
(0,1) < (1,), exactly as the authors' heap does. Nodes are numbered in pop order (non-increasing
score), so a parent always precedes its children.

Two builders, tested to agree exactly:
* `build_tree` - the paper's Algorithm 1, a best-first heap in Python (the slow, obvious twin).
* `build_tree_fast` - vectorised on the logits' device: per depth keep the top B extensions of the
  previous depth's kept prefixes (every global top-B node survives this, since its parent is in
  its own depth's top B), then take the global top B by (score desc, rank tuple asc). On a CPU,
  where that B x K candidate matrix per depth and the vocabulary sort are the cost, it runs
  `tree_cpu.build_tree_cpu` instead: the same heap, reading each depth's exact top ranks (ties
  included) only as far as the heap goes: the same tree.

`Tree` lists the non-root nodes: token_ids, parents (0 = root, i = node i, 1-based), depths (1..L).
`compile_tree` turns a tree plus its root (the bonus token) into verify ids, positions
(start + depth) and the ancestor-only visibility matrix; `verify_mask` puts the committed prefix in
front. Knows nothing of models or caches.
"""

from __future__ import annotations

import heapq
import struct
from dataclasses import dataclass

import torch

from ddtree_bench.engine.tree_cpu import build_tree_cpu
from ddtree_bench.engine.tree_vector import SortedTreeBuilder, _topk_logprobs


@dataclass
class Tree:
    token_ids: torch.Tensor  # [N] long
    parents: torch.Tensor    # [N] long, 0 = root, k = node k (1-based)
    depths: torch.Tensor     # [N] long, 1..L

    @property
    def num_nodes(self) -> int:
        return int(self.token_ids.numel())

    def to(self, device) -> "Tree":
        return Tree(self.token_ids.to(device), self.parents.to(device), self.depths.to(device))

    def paths(self) -> list[tuple[int, ...]]:
        """Token path of every node (root excluded), in node order. For tests and debugging."""
        toks, pars = self.token_ids.tolist(), self.parents.tolist()
        out: list[tuple[int, ...]] = []
        for i in range(len(toks)):
            p = pars[i]
            out.append((out[p - 1] if p > 0 else ()) + (toks[i],))
        return out


def empty_tree(device=None) -> Tree:
    z = torch.zeros(0, dtype=torch.long, device=device)
    return Tree(z, z.clone(), z.clone())


def chain_tree(tokens: torch.Tensor) -> Tree:
    """A single path (DFlash's block): node i has parent i-1 (node 1's parent is the root)."""
    n = tokens.numel()
    ar = torch.arange(n, device=tokens.device)
    return Tree(tokens.long().clone(), ar.clone(), ar + 1)


# ---------------------------------------------------------------------------- slow twin: the heap


def build_tree(draft_logits: torch.Tensor, budget: int) -> Tree:
    """The paper's best-first heap expansion (Algorithm 1). draft_logits: [L, V] raw logits."""
    L, V = draft_logits.shape
    if budget <= 0 or L == 0:
        return empty_tree()
    return _heap_tree(*_topk_logprobs(draft_logits.cpu(), min(budget, V)), budget)


def _f32(x: float) -> float:
    """x rounded to fp32 (the sum of two fp32 values in a double, rounded once more: the exact fp32 sum)."""
    return _F32.unpack(_F32.pack(x))[0]


_F32 = struct.Struct("f")


def _heap_tree(lp_t: torch.Tensor, tok_t: torch.Tensor, budget: int) -> Tree:
    """The heap over per-depth top-K log-probs lp_t [L, K] (descending, ties by token id) and ids tok_t."""
    L, K = lp_t.shape
    lp, tok = lp_t.tolist(), tok_t.tolist()
    f32 = _f32  # scores are accumulated in fp32, exactly as build_tree_fast's vectorised builders do

    # heap entries: (-score, rank tuple, parent node, depth, rank, parent score)
    heap = [(-lp[0][0], (0,), 0, 1, 0, 0.0)]
    tokens, parents, depths = [], [], []
    while heap and len(tokens) < budget:
        neg, ranks, parent, d, r, parent_score = heapq.heappop(heap)
        score = -neg
        tokens.append(tok[d - 1][r])
        parents.append(parent)
        depths.append(d)
        idx = len(tokens)  # this node's 1-based index
        if r + 1 < K:  # next sibling: same parent, next rank at this depth
            s = f32(parent_score + lp[d - 1][r + 1]) if d > 1 else lp[0][r + 1]
            heapq.heappush(heap, (-s, ranks[:-1] + (r + 1,), parent, d, r + 1, parent_score))
        if d < L:  # first child: rank 0 at the next depth
            s = f32(score + lp[d][0])
            heapq.heappush(heap, (-s, ranks + (0,), idx, d + 1, 0, score))
    as_long = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
    return Tree(as_long(tokens), as_long(parents), as_long(depths))


# ---------------------------------------------------------------------------- fast path: vectorised


def build_tree_fast(draft_logits: torch.Tensor, budget: int) -> Tree:
    """Same tree as `build_tree`, vectorised with static shapes; runs on the logits' device.

    Ordering is exact, ties included: every comparison is on one int64 key
    (score as an order-preserving integer, then a tie rank), and torch.topk on distinct keys is
    deterministic. Per depth the tie rank is the lexicographic rank of (parent's rank tuple, r);
    across depths it is the prefix's pre-order index in the trie of kept prefixes, which is its
    lexicographic rank among all kept rank tuples.
    """
    L, V = draft_logits.shape
    if budget <= 0 or L == 0:
        return empty_tree(draft_logits.device)
    if draft_logits.device.type == "cpu":   # the heap over lazily loaded exact top ranks, no sort of V
        return Tree(*build_tree_cpu(draft_logits, budget))
    token_ids, parents, depths = SortedTreeBuilder(L, V, budget, draft_logits.device)(draft_logits)
    return Tree(token_ids, parents, depths)


# ---------------------------------------------------------------------------- verify inputs


def ancestor_matrix_slow(parents: torch.Tensor) -> torch.Tensor:
    """[1+N, 1+N] bool, row i true on {root, ancestors of i, i}: the paper's row-copy loop."""
    n = parents.numel()
    vis = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    vis[0, 0] = True
    for i, p in enumerate(parents.tolist(), start=1):
        vis[i, :i] = vis[p, :i]
        vis[i, i] = True
    return vis


def ancestor_matrix(parents: torch.Tensor, max_depth: int | None = None) -> torch.Tensor:
    """Same as `ancestor_matrix_slow`, vectorised: follow parent pointers depth times (depth <= L)."""
    n = parents.numel()
    device = parents.device
    par = torch.cat([torch.zeros(1, dtype=torch.long, device=device), parents])  # root's parent: itself
    rows = torch.arange(n + 1, device=device)
    vis = torch.zeros(n + 1, n + 1, dtype=torch.bool, device=device)
    vis[rows, rows] = True
    cur = rows
    steps = n if max_depth is None else max_depth
    for _ in range(steps):
        cur = par[cur]
        vis[rows, cur] = True
    return vis


def compile_tree(tree: Tree, root_token: int | torch.Tensor, start: int, fast: bool = True):
    """Verify inputs for the root (bonus token, at position start) plus the tree.

    Returns ids [1+N], positions [1+N] (= start + depth, root depth 0) and the ancestor-only
    visibility [1+N, 1+N] bool among the tree tokens.
    """
    device = tree.token_ids.device
    root = torch.as_tensor(root_token, dtype=torch.long, device=device).reshape(1)
    ids = torch.cat([root, tree.token_ids])
    positions = start + torch.cat([torch.zeros(1, dtype=torch.long, device=device), tree.depths])
    if fast:
        max_depth = int(tree.depths.max()) if tree.num_nodes else 0
        anc = ancestor_matrix(tree.parents, max_depth)
    else:
        anc = ancestor_matrix_slow(tree.parents.cpu()).to(device)
    return ids, positions, anc


def verify_mask(anc: torch.Tensor, start: int) -> torch.Tensor:
    """[1+N, start+1+N] bool: every tree token sees the whole committed prefix, then its ancestors and itself."""
    prefix = torch.ones(anc.shape[0], start, dtype=torch.bool, device=anc.device)
    return torch.cat([prefix, anc], dim=1)
