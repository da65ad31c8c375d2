"""The vectorised DDTree tree build: exact int64 keys, the per-depth top-K, and `StaticTreeBuilder`.

Same tree as the heap (`tree.build_tree`): per depth keep the top F_d = min(B, F_{d-1} * K)
extensions of the previous depth's kept prefixes (every global top-B node survives this, since its
parent is in its own depth's top B), then take the global top B by (score desc, rank tuple asc).
Every comparison is on one int64 key (the fp32 score as an order-preserving integer in [0, 2^32),
shifted left, then a tie rank), and torch.topk on distinct keys is deterministic. Per depth the tie
rank is the lexicographic rank of (parent's rank tuple, r); across depths it is the prefix's
pre-order index in the trie of kept prefixes, which is its lexicographic rank among all kept rank
tuples. The key is exact only while score bits + tie bits fit in 63: `StaticTreeBuilder` refuses
budgets with budget * K >= 2^31 (as the Triton builders do) instead of overflowing silently.

Shapes depend only on (L, V, budget), never on the drafter's values, so one CUDA graph per budget
replays a whole build (gpu/loop.py); the plain loop uses it on GPUs through `tree.build_tree_fast`.
The shared pieces the Triton builders reuse (`topk_logprobs`, `fp32_logits`, `logprobs_at`,
`depth_counts`) live here too. Knows nothing of models, caches or graphs.
"""

from __future__ import annotations

import torch


def _topk_logprobs(draft_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-depth top-k of log_softmax in fp32: (logprobs [L, k], token ids [L, k]), descending.

    A stable sort, so equal logits rank by token id on every device (torch.topk leaves ties in an
    unspecified order, and a one-hot drafter makes almost every logit a tie). NaN logits (an
    overflowing half-precision drafter) and NaN log-probabilities (rows with no finite mass) count
    as -inf: any valid tree keeps decoding lossless, but NaN scores broke build_tree_fast's order
    and hung deep nodes off the root."""
    logits = draft_logits.float()
    logits = torch.where(torch.isnan(logits), float("-inf"), logits)
    vals, ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    vals, ids = vals[:, :k], ids[:, :k]
    lp = vals - torch.logsumexp(logits, dim=-1, keepdim=True)
    return torch.where(torch.isnan(lp), float("-inf"), lp), ids


def _desc_key(scores: torch.Tensor) -> torch.Tensor:
    """Map fp32 scores to int64 in [0, 2^32) so that a higher score gives a smaller key (exactly)."""
    s = scores.float() + 0.0  # -0.0 -> +0.0, so the two zeros tie as they do in Python
    i = s.view(torch.int32).to(torch.int64)
    ordinal = torch.where(i >= 0, i, i ^ 0x7FFFFFFF)  # increases with the float value
    return (2**31 - 1) - ordinal


def _rank_of(order: torch.Tensor) -> torch.Tensor:
    """Inverse permutation: rank[order[i]] = i."""
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)
    return rank


def preorder(parent: list, lexrank: list[torch.Tensor]) -> list[torch.Tensor]:
    """Pre-order index of every kept prefix in the trie they form = its lexicographic rank among all
    of them. parent[d][i]: index of entry i's parent among depth d-1's entries (unused at d = 0);
    lexrank[d]: lexicographic rank of each entry among its own depth's. Subtree sizes bottom-up, then
    pre(x) = pre(parent) + 1 + sizes of x's earlier siblings, top-down; all vectorised per depth."""
    L = len(lexrank)
    sizes = [torch.ones_like(r) for r in lexrank]
    for d in range(L - 1, 0, -1):
        sizes[d - 1] = sizes[d - 1].index_add(0, parent[d], sizes[d])
    pre: list[torch.Tensor] = []
    for d in range(L):
        order = torch.argsort(lexrank[d])                             # grouped by parent, r ascending
        sz = sizes[d][order]
        before = sz.cumsum(0) - sz
        if d == 0:
            earlier, base = before, 0
        else:
            par_sorted = parent[d][order]
            first = torch.ones_like(par_sorted, dtype=torch.bool)
            first[1:] = par_sorted[1:] != par_sorted[:-1]
            earlier = before - torch.cummax(torch.where(first, before, torch.zeros_like(before)), 0).values
            base = pre[d - 1][par_sorted] + 1
        p = torch.empty_like(sz)
        p[order] = base + earlier
        pre.append(p)
    return pre


def topk_logprobs(draft_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-depth top-k of log_softmax in fp32, descending, equal logits by ascending token id: the
    same (logprobs [L, k], ids [L, k]) as _topk_logprobs' stable sort, from one exact topk."""
    logits = fp32_logits(draft_logits)
    V = logits.shape[-1]
    bits = max(1, (V - 1).bit_length())
    key = (_desc_key(logits) << bits) | torch.arange(V, device=logits.device)
    ids = torch.topk(key, k, dim=-1, largest=False, sorted=True).indices
    return logprobs_at(logits, ids), ids


def fp32_logits(draft_logits: torch.Tensor) -> torch.Tensor:
    """The draft logits in fp32 with NaN as -inf, as tree.py reads them (a new tensor: one copy, one in-place pass)."""
    inf = float("inf")
    return draft_logits.to(torch.float32, copy=True).nan_to_num_(nan=-inf, posinf=inf, neginf=-inf)


def logprobs_at(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits) at ids [L, k] (fp32_logits in; NaN results -> -inf), by the ops every builder shares;
    with a leading slot axis ([C, L, V] at [C, L, k]) each slot gets the bits its own [L, V] gets."""
    return logprobs_from(logits.gather(-1, ids), log_normalisers(logits))


def logprobs_from(at: torch.Tensor, normalisers: torch.Tensor) -> torch.Tensor:
    """The log-probs from the (fp32, NaN as -inf) logits at the chosen ids and their rows' normalisers; NaN -> -inf."""
    lp = at - normalisers
    return torch.where(torch.isnan(lp), float("-inf"), lp)


def log_normalisers(logits: torch.Tensor) -> torch.Tensor:
    """logsumexp over the last dim, kept: [L, V] -> [L, 1], or per slot [C, L, V] -> [C, L, 1]. torch.logsumexp's own
    steps (amax; a max of +-inf counts as 0; the sum of exp(x - max); log; + max), equal to it bit for bit (tested),
    with every step but the sum over all slots at once: the max and the elementwise steps give the same bits in any
    batch, the sum's order depends on the shape PyTorch reduces, so it runs on each slot's own [L, V] block, as a
    one-slot call would (the batched tree builder's normalisers: batch 1's bits in C + 5 launches, not 9 C)."""
    m = logits.amax(dim=-1, keepdim=True)
    m = m.masked_fill(m.abs() == float("inf"), 0.0)
    return normalisers_from((logits - m).exp_(), m)


def normalisers_from(e: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """log_normalisers' last steps from exp(x - m) and m: the sum (each slot's own [L, V] block with a slot axis),
    log, + m; shared with kernels/normalisers.py, which makes e and m in one Triton pass."""
    s = e.sum(dim=-1, keepdim=True) if e.dim() < 3 else torch.stack([x.sum(dim=-1, keepdim=True) for x in e])
    return s.log_().add_(m)


def depth_counts(L: int, V: int, budget: int) -> tuple[int, list[int]]:
    """K = min(budget, V) tokens per depth, and how many prefixes each depth keeps: K at depth 1,
    then min(budget, previous * K) - the shape of every vectorised / one-kernel tree build."""
    K = min(budget, V)
    counts = [K]
    for _ in range(1, L):
        counts.append(min(budget, counts[-1] * K))
    return K, counts


def tree_nodes(L: int, V: int, budget: int) -> int:
    """N, the nodes of every exact builder's tree (the root not counted): min(budget, all kept prefixes)."""
    return min(budget, sum(depth_counts(L, V, budget)[1]))


class StaticTreeBuilder:
    """build_tree_fast for one (L, V, budget) with the shape-only constants made once.

    __call__(draft_logits [L, V]) -> (token_ids [N], parents [N], depths [N]), N = min(budget, total
    candidates), in pop order, parents 1-based (0 = root) - the same tensors as build_tree_fast."""

    name = "torch"

    def __init__(self, L: int, V: int, budget: int, device):
        if budget <= 0 or L <= 0:
            raise ValueError("StaticTreeBuilder needs budget > 0 and L > 0")
        self.L, self.V, self.budget = L, V, budget
        K, counts = depth_counts(L, V, budget)
        self.K, self.counts = K, counts
        self.tie_bits = max(1, (budget * K).bit_length())
        total = sum(counts)
        self.gbits = max(1, total.bit_length())
        if 32 + self.tie_bits > 63 or 32 + self.gbits > 63:   # 32 score bits + tie bits must fit an int64
            raise ValueError(f"budget {budget} is too large for exact int64 tree keys: budget * K = {budget * K} "
                             f"and {total} kept prefixes must stay below 2^31")
        self.arK = torch.arange(K, device=device)
        self.N = tree_nodes(L, V, budget)
        self.depth = torch.cat([torch.full((c,), d + 1, dtype=torch.long, device=device) for d, c in enumerate(counts)])
        offsets = [0]
        for c in counts:
            offsets.append(offsets[-1] + c)
        self.offsets = torch.tensor(offsets, dtype=torch.long, device=device)
        self.zeros0 = torch.zeros(counts[0], dtype=torch.long, device=device)
        self.node_ids = torch.arange(1, self.N + 1, device=device)

    def logprobs(self, draft_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The per-depth top-K (one exact topk over composite keys)."""
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

        return self._assemble(tok, scores, parent, rank, lexrank)

    def _assemble(self, tok, scores, parent, rank, lexrank) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The global top B of every depth's kept prefixes, numbered in pop order, as (tokens, parents, depths)."""
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


class SortedTreeBuilder(StaticTreeBuilder):
    """StaticTreeBuilder with the per-depth top-K taken by one stable sort of the vocabulary (the heap's
    `_topk_logprobs`): the same tree; what `tree.build_tree_fast` (the plain loop on GPUs) runs."""

    def logprobs(self, draft_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _topk_logprobs(draft_logits, self.K)


# ---------------------------------------------------------------------------- CPU: the exact top-K without a sort


def exact_topk_logprobs(draft_logits: torch.Tensor, k: int, chunks_per_k: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """The same (logprobs [L, k], ids [L, k]) as `_topk_logprobs`' stable sort, without sorting the vocabulary.

    Split each row into c = chunks_per_k * k chunks (at most V / 32, at least 2k; below that the
    vocabulary is small: `topk_logprobs`) of strided ids and take every chunk's max (one pass); the k-th
    largest chunk max t0 has at least k values >= it, so {x >= t0} holds the k-th largest value and
    every value above or equal to it: a superset of the exact top k, ties included (about k values on
    real logits; all of V when everything ties). It lies in the chunks whose max reaches t0 (about k
    of them, plus the values past the last whole chunk), so only those are scanned. Only the superset
    gets exact int64 keys (value desc, id asc) and one small topk. A NaN anywhere shows in a chunk max
    and sends the input through fp32_logits (NaN -> -inf) first."""
    logits = draft_logits.float()
    L, V = logits.shape
    width = max(32, V // (chunks_per_k * k))       # more chunks make t0's topk slow
    c = V // width
    if c < 2 * k:
        return topk_logprobs(logits, k)
    # chunk j = ids {j, j + c, j + 2c, ...}: the max over them is an elementwise max of width rows (fast)
    head, tail = logits[:, : c * width].reshape(L, width, c), logits[:, c * width:]
    chunk_max = head.amax(dim=1)
    if torch.isnan(chunk_max).any() or torch.isnan(tail).any():      # rare: NaN counts as -inf
        logits = fp32_logits(logits)
        head, tail = logits[:, : c * width].reshape(L, width, c), logits[:, c * width:]
        chunk_max = head.amax(dim=1)
    t0 = torch.topk(torch.cat([chunk_max, tail], dim=1), k, dim=-1, sorted=False).values.min(dim=-1, keepdim=True).values
    r, ch = torch.nonzero(chunk_max >= t0, as_tuple=True)            # only chunks whose max reaches t0 hold candidates
    hit, j = torch.nonzero(head[r, :, ch] >= t0[r], as_tuple=True)
    tr, tj = torch.nonzero(tail >= t0, as_tuple=True)
    rows = torch.cat([r[hit], tr])
    cols = torch.cat([j * c + ch[hit], c * width + tj])
    bits = max(1, (V - 1).bit_length())
    key = (_desc_key(logits[rows, cols]) << bits) | cols
    per_row = torch.bincount(rows, minlength=L)
    padded = torch.full((L, int(per_row.max())), torch.iinfo(torch.int64).max, dtype=torch.int64)
    order = torch.argsort(rows, stable=True)                          # group by row
    slot = torch.arange(rows.numel()) - torch.repeat_interleave(per_row.cumsum(0) - per_row, per_row)
    padded[rows[order], slot] = key[order]
    ids = torch.topk(padded, k, dim=-1, largest=False, sorted=True).values & ((1 << bits) - 1)
    # log_softmax at ids: torch.logsumexp's own steps (amax, inf -> 0, sum of exp(x - max), log, + max),
    # with the max taken from the chunk maxima instead of another pass: the same bits (tested)
    row_max = torch.maximum(chunk_max.amax(dim=-1), tail.amax(dim=-1)) if tail.shape[1] else chunk_max.amax(dim=-1)
    row_max = torch.where(row_max.abs() == float("inf"), torch.zeros_like(row_max), row_max)
    lse = torch.stack([(logits[i] - row_max[i]).exp_().sum() for i in range(L)]).log_().add_(row_max)  # row by row: cache-sized
    lp = logits.gather(-1, ids) - lse[:, None]
    return torch.where(torch.isnan(lp), float("-inf"), lp), ids
