"""The CPU tree build: the paper's heap, reading each depth's exact top-k only as far as the heap goes.

The heap (`tree._heap_tree`, Algorithm 1) pops B nodes; at depth d it only ever reads the log-probs of
ranks it pushes: rank 0 of a depth below a popped node, and rank r + 1 after rank r was popped. On
real drafter logits that is a few ranks at most depths and a few hundred at one or two, never K =
min(B, V) at all fifteen. So each depth's ranks are loaded lazily: the exact top k_d of that depth
(k_d = 64 first, then x16 up to the rank the heap asks for, capped at K), found without sorting the
vocabulary (`row_topk_ids`). The order inside a loaded top k_d is exact, ties included (equal logits
rank by ascending token id at every rank, the stable sort's order), and a top-k of a total order is a
prefix of every larger top-k of it, so growing k_d never reorders what the heap already read: the
tree is node for node the heap's over the full stable sort (`tree.build_tree`, tested).

Log-probabilities are logit - logsumexp(row) in fp32, as the reference computes them. The build
runs on one torch thread: its ops are small and many (a few per depth read), and with two threads on
a busy machine each parallel op waits for the other core (docs/gpu-performance.md). One thread also
keeps a row's normaliser (torch.logsumexp's own steps on that row, `_LazyRanks.row`) on the bits of
the reference's [L, V] logsumexp, which reduces every row serially; a one-row reduction on several
threads splits its sum across them and can differ in the last bit (tested at 1 and 2 threads). A NaN logit (an overflowing half-precision drafter) shows in its
row's max; that row is read as `tree_vector.fp32_logits` reads it (NaN -> -inf), in a copy.
Vocabularies up to EAGER_MAX_V load every depth at once instead (`tree_vector.exact_topk_logprobs`:
one call beats L small ones there). Knows nothing of models or devices: CPU tensors in,
(token_ids, parents, depths) out.
"""

from __future__ import annotations

import heapq
import struct
from contextlib import contextmanager

import numpy as np
import torch

from ddtree_bench.engine.tree_vector import exact_topk_logprobs, fp32_logits

FIRST_K = 64      # ranks loaded the first time a depth is read (a load's cost is mostly fixed below ~256)
GROWTH = 16       # each later load multiplies the loaded ranks by this (at least to the rank asked for)
CHUNKS_PER_K = 16  # row_topk_ids: chunks per wanted rank (more chunks: a slower threshold topk)
_F32 = struct.Struct("f")   # a double rounded to fp32 by pack/unpack, as tree._f32 rounds the heap's sums
EAGER_MAX_V = 4096  # vocabularies up to this load every depth's top K at once (one call beats L small ones)
EXP_FLOOR = -87.0   # exp(x - max) is taken of max(x - max, this): exp(-87) = 1.6e-38 is still a normal fp32


def row_topk_ids(row: torch.Tensor, k: int) -> np.ndarray:
    """Ids of the k largest values of one fp32 row (no NaN), value descending, equal values by ascending id.

    Split the row into c ~ 16 k chunks of strided ids (chunk j = ids j, j + c, j + 2c, ...; width >= 32)
    and take every chunk's max in one pass (an elementwise max of `width` rows of c: vectorised, where
    a max over consecutive ids reduces short rows); the k-th largest of those maxima (and of the values
    past the last whole chunk), t0, has at least k values >= it, so {x >= t0} is a superset of the
    exact top k with every tie at its boundary. It lies in the chunks whose max reaches t0 (k of them
    unless maxima tie), the only ones scanned. Small rows (fewer than 2k chunks) take t0 as the row's
    own k-th largest value. The superset (about k values on real logits; all of V when everything
    ties) is ordered exactly by one stable lexsort on (value desc, id asc), where -0.0 and +0.0 tie as
    in the stable sort. In numpy on the row's memory: the work is a dozen small steps, each a few
    microseconds there against tens in torch's dispatcher."""
    x = row.numpy()
    V = x.size
    width = max(32, V // (CHUNKS_PER_K * k))
    c = V // width
    if c < 2 * k:
        cols = np.flatnonzero(x >= np.partition(x, V - k)[V - k])
    else:
        head, tail = x[: c * width].reshape(width, c), x[c * width:]   # head[i, j] = id i * c + j, in chunk j
        chunk_max = head.max(axis=0)
        pool = np.concatenate([chunk_max, tail])
        t0 = np.partition(pool, pool.size - k)[pool.size - k]
        ch = np.flatnonzero(chunk_max >= t0)
        i, hit = np.nonzero(head[:, ch] >= t0)
        cols = np.concatenate([i * c + ch[hit], c * width + np.flatnonzero(tail >= t0)])
    return cols[np.lexsort((cols, -x[cols]))[:k]]


class _LazyRanks:
    """Per depth: the log-probs and token ids of its top ranks, as Python lists, loaded on demand."""

    def __init__(self, logits: torch.Tensor, K: int):
        self.logits, self.given, self.K = logits, logits, K   # given: the caller's tensor, never written
        L = logits.shape[0]
        self.lse: list[float | None] = [None] * L   # set when row d is first read (NaN replaced by then)
        self.lp: list[list[float]] = [[] for _ in range(L)]
        self.tok: list[list[int]] = [[] for _ in range(L)]
        self.scratch: torch.Tensor | None = None   # one row's exp(x - max), reused by every row

    def normaliser(self, d: int) -> float:
        """logsumexp of row d in fp32 (on one torch thread: see the module docstring)."""
        self.row(d)
        return self.lse[d]

    def row(self, d: int) -> torch.Tensor:
        """Row d of the logits, NaN read as -inf, its normaliser taken on first read.

        torch.logsumexp's own steps (amax; a max of +-inf counts as 0; sum of exp(x - max) in one
        reduction; log; + max), so its bits, with two passes fewer: the amax doubles as the NaN check
        (NaN reaches the max) and exp(x - max) goes to a reused buffer instead of a fresh 600 KB one.
        One step differs: x - max is floored at EXP_FLOOR before the exp. Below it torch.exp's result is
        subnormal or zero and takes a scalar slow path (~50x a row: 6.8 -> 0.13 ms on a randn x 20 row
        of 151,936); floored, each such term adds exp(-87) = 1.6e-38 instead of less, at most
        V * 1.6e-38 (2.5e-33 at V = 151,936) in a sum >= 1 (the max's own term is 1) whose half-ulp is
        6e-8, so the normaliser keeps torch.logsumexp's bits (tested on rows spanning up to ~500 nats).
        Each row is cold in the caches when first read, so a pass costs most of a row's load."""
        if self.lse[d] is None:
            x = self.logits[d]
            m = x.amax()
            if m.isnan():
                if self.logits is self.given:
                    self.logits = self.logits.clone()
                self.logits[d] = fp32_logits(x)
                x = self.logits[d]
                m = x.amax()
            if m.isinf():
                m = torch.zeros_like(m)
            if self.scratch is None:
                self.scratch = torch.empty_like(x)
            torch.sub(x, m, out=self.scratch)
            self.lse[d] = self.scratch.clamp_(min=EXP_FLOOR).exp_().sum().log_().add_(m).item()
        return self.logits[d]

    def load_all(self) -> None:
        """Every depth's exact top K at once (`tree_vector.exact_topk_logprobs`, all rows in one go)."""
        lp, ids = exact_topk_logprobs(self.logits, self.K)
        self.lp[:], self.tok[:] = lp.tolist(), ids.tolist()

    def load(self, d: int, rank: int) -> list[float]:
        """Depth d's log-probs with at least rank + 1 entries (rank < K); the token ids go to self.tok[d]."""
        have = len(self.lp[d])
        k = min(self.K, max(rank + 1, FIRST_K if have == 0 else GROWTH * have))
        row = self.row(d)
        ids = row_topk_ids(row, k)
        with np.errstate(invalid="ignore"):                              # inf - inf: rows with no finite mass
            lp = row.numpy()[ids] - np.float32(self.normaliser(d))   # one fp32 subtraction, as torch's
        lp[np.isnan(lp)] = -np.inf
        self.lp[d], self.tok[d] = lp.tolist(), ids.tolist()
        return self.lp[d]


def build_tree_cpu(draft_logits: torch.Tensor, budget: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token_ids, parents, depths) of `tree.build_tree(draft_logits, budget)`'s Tree, as
    `tree_vector.StaticTreeBuilder` returns them (tree.build_tree_fast wraps them; this module does
    not import tree.py, which imports it); draft_logits [L, V] on the CPU, budget > 0."""
    L, V = draft_logits.shape
    K = min(budget, V)
    with _one_thread():
        ranks = _LazyRanks(draft_logits.float(), K)
        if V <= EAGER_MAX_V:
            ranks.load_all()
        return _heap(ranks, L, K, budget)


@contextmanager
def _one_thread():
    """torch on one intra-op thread inside, the caller's count restored after (~5 us a switch)."""
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _heap(ranks: _LazyRanks, L: int, K: int, budget: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tree._heap_tree over lazily loaded ranks: entries (-score, rank tuple, parent node, depth, rank,
    parent score), scores summed in fp32 from depth 1 down."""
    lp, tok, load = ranks.lp, ranks.tok, ranks.load
    pack, unpack = _F32.pack, _F32.unpack
    first = lp[0] or load(0, 0)
    heap = [(-first[0], (0,), 0, 1, 0, 0.0)]
    push, pop, replace = heapq.heappush, heapq.heappop, heapq.heapreplace
    tokens, parents, depths = [], [], []
    n = 0
    while heap and n < budget:
        neg, rank_tuple, parent, d, r, parent_score = heap[0]   # popped below: replaced by its next sibling
        score = -neg
        tokens.append(tok[d - 1][r])
        parents.append(parent)
        depths.append(d)
        n += 1
        if r + 1 < K:      # next sibling: same parent, next rank at this depth
            row = lp[d - 1] if r + 1 < len(lp[d - 1]) else load(d - 1, r + 1)
            s = unpack(pack(parent_score + row[r + 1]))[0] if d > 1 else row[r + 1]
            replace(heap, (-s, rank_tuple[:-1] + (r + 1,), parent, d, r + 1, parent_score))
        else:
            pop(heap)
        if d < L:          # first child: rank 0 at the next depth
            row = lp[d] or load(d, 0)
            push(heap, (-unpack(pack(score + row[0]))[0], rank_tuple + (0,), n, d + 1, 0, score))
    as_long = lambda xs: torch.tensor(xs, dtype=torch.long)  # noqa: E731
    return as_long(tokens), as_long(parents), as_long(depths)
