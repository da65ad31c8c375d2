"""Fixed-shape tree build, verify inputs, walk and commit bookkeeping: graph-capturable, no host syncs.

Everything here has shapes that depend only on (L, V, budget), never on the drafter's values, so
one CUDA graph per budget replays a whole stage. Same results as tree.py / verify.py:
* `StaticTreeBuilder` is `build_tree_fast` (same algorithm, same exact int64 keys and tie rule)
  with its per-budget constants made once instead of per call (no host->device copies, no
  data-dependent `repeat_interleave`), and the per-depth top-K taken with one `topk` over exact
  composite keys (score, token id) instead of a full stable sort of the vocabulary.
* `ancestors` follows parent pointers exactly L times (the tree depth is at most L), so it needs no
  `max()` read back to the host.
* `walk_static` returns the accepted path as fixed-size tensors: a = number of accepted nodes
  (root counted), the accepted node index at each depth 0..L, their tokens, and the bonus token.
  The caller moves that one small vector to the host: the only sync of a round.
Knows nothing of models, caches or graphs.
"""

from __future__ import annotations

import torch

from ddtree_bench.engine.tree import _desc_key, _rank_of, preorder


def topk_logprobs(draft_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-depth top-k of log_softmax in fp32, descending, equal logits by ascending token id: the
    same (logprobs [L, k], ids [L, k]) as tree._topk_logprobs' stable sort, from one exact topk."""
    logits = fp32_logits(draft_logits)
    V = logits.shape[-1]
    bits = max(1, (V - 1).bit_length())
    key = (_desc_key(logits) << bits) | torch.arange(V, device=logits.device)
    ids = torch.topk(key, k, dim=-1, largest=False, sorted=True).indices
    return logprobs_at(logits, ids), ids


def fp32_logits(draft_logits: torch.Tensor) -> torch.Tensor:
    """The draft logits in fp32 with NaN as -inf, as tree.py reads them."""
    logits = draft_logits.float()
    return torch.where(torch.isnan(logits), float("-inf"), logits)


def logprobs_at(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits) at ids [L, k] (fp32_logits in; NaN results -> -inf), by the ops every builder shares."""
    lp = logits.gather(-1, ids) - torch.logsumexp(logits, dim=-1, keepdim=True)
    return torch.where(torch.isnan(lp), float("-inf"), lp)


def depth_counts(L: int, V: int, budget: int) -> tuple[int, list[int]]:
    """K = min(budget, V) tokens per depth, and how many prefixes each depth keeps: K at depth 1,
    then min(budget, previous * K) - the shape of every vectorised / one-kernel tree build."""
    K = min(budget, V)
    counts = [K]
    for _ in range(1, L):
        counts.append(min(budget, counts[-1] * K))
    return K, counts


class StaticTreeBuilder:
    """build_tree_fast for one (L, V, budget) with the shape-only constants made once.

    __call__(draft_logits [L, V]) -> (token_ids [N], parents [N], depths [N]), N = min(budget, total
    candidates), in pop order, parents 1-based (0 = root) - the same tensors as build_tree_fast."""

    name = "torch"

    def __init__(self, L: int, V: int, budget: int, device, full_sort: bool = False):
        if budget <= 0 or L <= 0:
            raise ValueError("StaticTreeBuilder needs budget > 0 and L > 0")
        self.L, self.V, self.budget = L, V, budget
        self.full_sort = full_sort
        K, counts = depth_counts(L, V, budget)
        self.K, self.counts = K, counts
        self.tie_bits = max(1, (budget * K).bit_length())
        self.arK = torch.arange(K, device=device)
        total = sum(counts)
        self.N = min(budget, total)
        self.gbits = max(1, total.bit_length())
        self.depth = torch.cat([torch.full((c,), d + 1, dtype=torch.long, device=device) for d, c in enumerate(counts)])
        offsets = [0]
        for c in counts:
            offsets.append(offsets[-1] + c)
        self.offsets = torch.tensor(offsets, dtype=torch.long, device=device)
        self.zeros0 = torch.zeros(counts[0], dtype=torch.long, device=device)
        self.node_ids = torch.arange(1, self.N + 1, device=device)

    def logprobs(self, draft_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.full_sort:  # the plain builder's way, kept for timing comparisons
            from ddtree_bench.engine.tree import _topk_logprobs

            return _topk_logprobs(draft_logits, self.K)
        return topk_logprobs(draft_logits, self.K)

    def __call__(self, draft_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        L, K = self.L, self.K
        lp, tok = self.logprobs(draft_logits)
        arK = self.arK
        scores, parent, rank, lexrank = [lp[0]], [None], [arK], [arK]
        for d in range(1, L):
            cand = scores[-1][:, None] + lp[d][None, :]
            tie = lexrank[-1][:, None] * K + arK
            key = (_desc_key(cand) << self.tie_bits) | tie
            keep = torch.topk(key.flatten(), self.counts[d], largest=False, sorted=True).indices
            scores.append(cand.flatten()[keep])
            parent.append(keep // K)
            rank.append(keep % K)
            lexrank.append(_rank_of(torch.argsort(tie.flatten()[keep])))

        S, P = torch.cat(scores), torch.cat(preorder(parent, lexrank))
        gkey = (_desc_key(S) << self.gbits) | P
        chosen = torch.topk(gkey, self.N, largest=False, sorted=True).indices
        node_of = torch.zeros(S.numel(), dtype=torch.long, device=S.device)
        node_of[chosen] = self.node_ids
        d = self.depth[chosen]
        flat_parent = torch.cat([self.zeros0] + parent[1:])[chosen]
        parents = torch.where(d > 1, node_of[flat_parent + self.offsets[(d - 2).clamp(min=0)]], torch.zeros_like(d))
        token_ids = tok[d - 1, torch.cat(rank)[chosen]]
        return token_ids, parents, d


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
    anc [T, T], post [T] = the target's pick at every position. Returns one long vector of 2L+4:
    [a, node index at depth 0..L (unused depths 0), token at depth 0..L, bonus]."""
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
    return torch.cat([a, idx, ids.gather(0, idx), bonus])


def commit_sources(walked: torch.Tensor, L: int) -> tuple[torch.Tensor, torch.Tensor]:
    """From walk_static's vector: (a [1], source row for each kept slot 0..L): accepted node i for
    i < a, else i itself (a no-op move)."""
    a = walked[:1]
    idx = walked[1 : L + 2]
    ar = torch.arange(L + 1, device=walked.device)
    return a, torch.where(ar < a, idx, ar)


def commit_static(walked: torch.Tensor, L: int, guard: bool, start: torch.Tensor, ctx_start: torch.Tensor,
                  bonus: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hidden: torch.Tensor, ctx: torch.Tensor) -> None:
    """Commit a walked round in place. walked: walk_static's vector (+ the builder's certificate flag
    at the end when `guard`); k, v [layers, Hkv, S, D] cache; hidden [T, C] the verify rows' context
    features; ctx [L+1, C]. Moves the accepted path's K/V rows to slots start..start+L (the others
    move onto themselves), gathers its hidden rows into ctx, sets ctx_start = start, advances start
    by a and stores the bonus. With guard and a raised flag nothing changes (a counts as 0)."""
    keep = walked[-1:] == 0 if guard else None   # [1] bool: the tree is certified
    a, src = commit_sources(walked if keep is None else torch.cat([walked[:1] * keep, walked[1:]]), L)
    ar = torch.arange(L + 1, device=walked.device)
    dst, srcs = start + ar, start + src
    k.index_copy_(2, dst, k.index_select(2, srcs))
    v.index_copy_(2, dst, v.index_select(2, srcs))
    rows = hidden.index_select(0, src.clamp(max=hidden.shape[0] - 1))
    new_bonus = walked[2 * L + 3 : 2 * L + 4]
    if keep is None:
        ctx.copy_(rows)
        ctx_start.copy_(start)
        bonus.copy_(new_bonus)
    else:
        ctx.copy_(torch.where(keep, rows, ctx))
        ctx_start.copy_(torch.where(keep[0], start, ctx_start))
        bonus.copy_(torch.where(keep, new_bonus, bonus))
    start.add_(a.view(()))
