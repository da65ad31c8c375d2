"""DDTree tree construction, verify inputs and the tree walk, against brute force and each other.

The oracle is the definition: the tree of budget B is the B most probable prefixes of the factorised
draft distribution (score = sum of per-depth log-probabilities, accumulated from depth 1 in fp32),
ordered by score, ties broken by the lexicographically smaller tuple of 0-based per-depth ranks
(rank = position in a stable descending sort of that depth's logits). Enumerating every prefix of a
small [L, V] gives that list directly; `build_tree` (heap) and `build_tree_fast` (vectorised) must
both reproduce it node for node.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from ddtree_bench.engine.tree import (
    Tree,
    ancestor_matrix,
    ancestor_matrix_slow,
    build_tree,
    build_tree_fast,
    chain_tree,
    compile_tree,
    verify_mask,
)
from ddtree_bench.engine.verify import walk, walk_fast
from engine_support import one_torch_thread  # noqa: F401 (fixture)


# ---------------------------------------------------------------------------- the oracle


def brute_force(logits: torch.Tensor, budget: int) -> list[tuple[tuple[int, ...], float, tuple[int, ...]]]:
    """Every prefix of depth 1..L as (token path, fp32 score, rank tuple), best first, cut at budget."""
    L, V = logits.shape
    lg = logits.float()
    lp = lg - torch.logsumexp(lg, dim=-1, keepdim=True)  # log_softmax exactly as the engine computes it
    order = torch.sort(lg, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    for d in range(L):
        rank[d, order[d]] = torch.arange(V)
    entries = []
    frontier = [((), torch.tensor(0.0, dtype=torch.float32), ())]
    for d in range(L):
        nxt = []
        for path, score, ranks in frontier:
            for t in range(V):
                s = lp[d, t].clone() if d == 0 else (score + lp[d, t])  # fp32 add, depth order
                item = (path + (t,), s, ranks + (int(rank[d, t]),))
                nxt.append(item)
                entries.append(item)
        frontier = nxt
    entries.sort(key=lambda e: (-float(e[1]), e[2]))
    return [(p, float(s), r) for p, s, r in entries[: max(budget, 0)]]


def tree_tuple(tree: Tree) -> tuple[list[int], list[int], list[int]]:
    return tree.token_ids.tolist(), tree.parents.tolist(), tree.depths.tolist()


def check_invariants(tree: Tree, logits: torch.Tensor, check_order: bool = True) -> None:
    toks, pars, deps = tree_tuple(tree)
    n = len(toks)
    L = logits.shape[0]
    assert len(pars) == len(deps) == n
    for i in range(n):  # node i is 1-based index i+1
        assert 0 <= pars[i] < i + 1, "parents precede children"
        parent_depth = 0 if pars[i] == 0 else deps[pars[i] - 1]
        assert deps[i] == parent_depth + 1, "depth = parent depth + 1"
        assert 1 <= deps[i] <= L
    paths = tree.paths()
    assert len(set(paths)) == n, "no duplicate paths"
    # non-increasing score, ties in lexicographic rank-tuple order: compare with the oracle's keys
    small = check_order and logits.shape[1] ** L <= 5000
    oracle = {p: (s, r) for p, s, r in brute_force(logits, 10**9)} if small else None
    if oracle is not None:
        keys = [(-oracle[p][0], oracle[p][1]) for p in paths]
        assert keys == sorted(keys), "nodes are in pop order (score desc, rank tuple asc)"


def random_logits(kind: str, L: int, V: int, g: torch.Generator) -> torch.Tensor:
    if kind == "normal":
        return torch.randn(L, V, generator=g) * 2.0
    if kind == "integer":  # many exact ties inside a depth and equal path sums across depths
        return torch.randint(0, 3, (L, V), generator=g).float()
    if kind == "onehot":  # every depth: one token at 5, the rest tied at 0
        x = torch.zeros(L, V)
        x[torch.arange(L), torch.randint(0, V, (L,), generator=g)] = 5.0
        return x
    if kind == "flat":  # everything tied: the order is pure rank-tuple order
        return torch.zeros(L, V)
    if kind == "masked":  # a drafter that rules tokens out: -inf logits (zero-probability prefixes tie at -inf)
        x = torch.randn(L, V, generator=g)
        x[torch.rand(L, V, generator=g) < 0.5] = float("-inf")
        x[:, 0] = torch.randn(L, generator=g)  # at least one finite logit per depth
        return x
    raise ValueError(kind)


# ---------------------------------------------------------------------------- build_tree vs brute force


@pytest.mark.parametrize("kind", ["normal", "integer", "onehot", "flat", "masked"])
def test_build_tree_equals_brute_force_top_b_prefixes(kind):
    g = torch.Generator().manual_seed(1234)
    cases = 0
    for L, V in [(1, 5), (2, 4), (3, 5), (4, 3), (3, 7)]:
        total = sum(V**d for d in range(1, L + 1))
        for budget in sorted({0, 1, 2, 3, V - 1, V, V + 1, 7, 16, total - 1, total, total + 5, 1000}):
            if budget < 0:
                continue
            logits = random_logits(kind, L, V, g)
            want = brute_force(logits, budget)
            for builder in (build_tree, build_tree_fast):
                tree = builder(logits, budget)
                assert tree.num_nodes == min(budget, total)
                assert tree.paths() == [p for p, _, _ in want], (builder.__name__, L, V, budget)
                check_invariants(tree, logits)
            cases += 1
    assert cases > 50


@pytest.mark.parametrize("kind", ["normal", "integer", "onehot", "flat", "masked"])
def test_fast_equals_heap_exactly_on_larger_inputs(kind):
    """Token ids, parents and depths identical, at the engine's real shape (L = 15) and beyond V."""
    g = torch.Generator().manual_seed(99)
    for L, V, budgets in [(15, 64, (1, 3, 15, 16, 64, 300)), (15, 8, (7, 8, 9, 100)), (6, 2, (1, 5, 62, 126, 200))]:
        for budget in budgets:
            logits = random_logits(kind, L, V, g)
            slow, fast = build_tree(logits, budget), build_tree_fast(logits, budget)
            assert tree_tuple(slow) == tree_tuple(fast), (kind, L, V, budget)
            check_invariants(slow, logits)


def test_nan_and_inf_draft_logits_still_give_a_valid_tree():
    """An overflowing half-precision drafter can emit NaN or +-inf logits. Any valid tree keeps
    decoding lossless, an invalid one (a deep node hanging off the root) does not: both builders
    must return the same valid tree (NaN and non-finite rows count as zero probability)."""
    g = torch.Generator().manual_seed(0)
    for seed in range(120):
        L, V = 6, 5
        x = torch.randn(L, V, generator=g)
        x[torch.rand(L, V, generator=g) < 0.1] = float("nan")
        if seed % 3 == 0:
            x[seed % L] = float("nan")  # a whole row
        if seed % 5 == 0:
            x[(seed + 1) % L, 2] = float("inf")
        for budget in (1, 4, 20, 200):
            slow, fast = build_tree(x, budget), build_tree_fast(x, budget)
            check_invariants(slow, x, check_order=False)
            check_invariants(fast, x, check_order=False)
            assert tree_tuple(slow) == tree_tuple(fast), (seed, budget)


def test_budget_edge_cases():
    logits = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    for builder in (build_tree, build_tree_fast):
        assert builder(logits, 0).num_nodes == 0
        one = builder(logits, 1)
        assert tree_tuple(one) == ([int(logits[0].argmax())], [0], [1])
        # more than all prefixes: every prefix appears once
        tiny = torch.randn(2, 3, generator=torch.Generator().manual_seed(1))
        full = builder(tiny, 50)
        assert sorted(full.paths()) == sorted(itertools.chain(((a,) for a in range(3)), itertools.product(range(3), repeat=2)))
        # V < budget: depth 1 holds all V tokens
        wide = builder(tiny, 5)
        assert sum(1 for d in wide.depths.tolist() if d == 1) == 3
        # L = 0: nothing to draft
        assert builder(torch.zeros(0, 6), 10).num_nodes == 0


def test_heavy_ties_follow_rank_tuple_order():
    """All logits equal: pop order is exactly the lexicographic order of rank tuples among the
    best-scoring prefixes, i.e. all depth-1 tokens by id (score -log V), then depth 2, ..."""
    logits = torch.zeros(3, 3)
    for builder in (build_tree, build_tree_fast):
        t = builder(logits, 5)
        assert t.paths() == [(0,), (1,), (2,), (0, 0), (0, 1)]


# ---------------------------------------------------------------------------- verify inputs


def random_tree(seed: int, L: int = 6, V: int = 5, budget: int = 40) -> Tree:
    g = torch.Generator().manual_seed(seed)
    return build_tree(random_logits(["normal", "integer", "onehot"][seed % 3], L, V, g), budget)


def test_ancestor_matrix_equals_slow_twin():
    for seed in range(30):
        tree = random_tree(seed, budget=1 + seed * 3)
        slow = ancestor_matrix_slow(tree.parents)
        assert torch.equal(ancestor_matrix(tree.parents), slow)
        assert torch.equal(ancestor_matrix(tree.parents, int(tree.depths.max())), slow)
        # row i is true exactly on root, ancestors and itself
        pars = [0] + tree.parents.tolist()
        for i in range(1, tree.num_nodes + 1):
            anc, j = {0, i}, i
            while j:
                j = pars[j]
                anc.add(j)
            assert set(torch.nonzero(slow[i]).flatten().tolist()) == anc
    empty = Tree(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long))
    assert torch.equal(ancestor_matrix(empty.parents), torch.ones(1, 1, dtype=torch.bool))


def test_compile_tree_and_verify_mask():
    tree = random_tree(4, budget=20)
    for fast in (True, False):
        ids, pos, anc = compile_tree(tree, 7, start=11, fast=fast)
        assert ids.tolist() == [7] + tree.token_ids.tolist()
        assert pos.tolist() == [11] + [11 + d for d in tree.depths.tolist()]
        assert torch.equal(anc, ancestor_matrix_slow(tree.parents))
        m = verify_mask(anc, 11)
        assert m.shape == (1 + tree.num_nodes, 11 + 1 + tree.num_nodes)
        assert m[:, :11].all() and torch.equal(m[:, 11:], anc)
    chain = chain_tree(torch.tensor([4, 2, 9]))
    assert tree_tuple(chain) == ([4, 2, 9], [0, 1, 2], [1, 2, 3])


def test_walk_fast_equals_walk_on_random_trees_and_picks():
    rng = random.Random(5)
    deep = 0
    for seed in range(200):
        tree = random_tree(seed, L=5, V=4, budget=rng.choice([0, 1, 3, 10, 40, 100]))
        n, V = tree.num_nodes, 4
        post = [rng.randrange(V) for _ in range(n + 1)]
        if n and rng.random() < 0.8:  # steer the picks down a random path so walks go deep
            node = rng.randrange(1, n + 1)
            pars, toks = [0] + tree.parents.tolist(), [None] + tree.token_ids.tolist()
            while node:
                post[pars[node]] = toks[node]
                node = pars[node]
        root = 3
        slow = walk(tree, root, post)
        anc = ancestor_matrix(tree.parents)
        fast = walk_fast(tree, anc, torch.tensor(post))
        assert slow == fast, seed
        acc, bonus = slow
        # the walk's own definition: a path from the root, each node's token = its parent's pick
        pars, toks = [0] + tree.parents.tolist(), [None] + tree.token_ids.tolist()
        assert acc[0] == 0
        for a, b in zip(acc, acc[1:]):
            assert pars[b] == a and toks[b] == post[a]
        assert bonus == post[acc[-1]]
        assert not any(pars[c] == acc[-1] and toks[c] == bonus for c in range(1, n + 1))
        deep += len(acc) >= 4
    assert deep > 10


def test_the_pytorch_builder_refuses_budgets_its_int64_keys_cannot_hold():
    """Its keys are (32-bit score key << tie bits) | tie rank with tie ranks up to budget * K; from
    budget * K = 2^31 on they no longer fit an int64 and the tree would be silently wrong (ties and
    scores mixed up), so the builder refuses, as the Triton builders do. K = min(budget, V)."""
    from ddtree_bench.engine.tree_vector import StaticTreeBuilder

    ok = StaticTreeBuilder(2, 46340, 46340, "cpu")         # 46340^2 = 2,147,395,600 < 2^31
    assert ok.tie_bits == 31
    with pytest.raises(ValueError, match="too large for exact int64 tree keys"):
        StaticTreeBuilder(2, 46341, 46341, "cpu")          # 46341^2 >= 2^31
    from ddtree_bench.engine.tree_vector import SortedTreeBuilder

    with pytest.raises(ValueError, match="too large"):     # the plain loop's GPU path (build_tree_fast off the CPU)
        SortedTreeBuilder(2, 46341, 46341, "cpu")
    assert StaticTreeBuilder(2, 10, 46341, "cpu").K == 10  # small vocabularies cap K: fine


# ---------------------------------------------------------------------------- the CPU build on real-sized vocabularies


def planted_ties(kind: str, L: int, V: int, g: torch.Generator) -> torch.Tensor:
    """Large-vocabulary logits with exact ties planted at many ranks inside the top K, at its boundary
    and below it (integer values), whole tied rows, -inf, NaN and +inf."""
    if kind == "integer":        # ~V/40 tokens share every value: ties at every rank
        return torch.randint(0, 40, (L, V), generator=g).float()
    if kind == "steps":          # a few distinct high values, each repeated 1..9 times, over noise
        x = torch.randn(L, V, generator=g)
        for d in range(L):
            for v in range(30):
                ids = torch.randint(0, V, (1 + v % 9,), generator=g)
                x[d, ids] = 10.0 - 0.25 * v
        return x
    if kind == "onehot":
        x = torch.zeros(L, V)
        x[torch.arange(L), torch.randint(0, V, (L,), generator=g)] = 5.0
        return x
    if kind == "special":        # -inf masks, a NaN row, NaN entries, a +inf, a flat row
        x = torch.randn(L, V, generator=g).round()
        x[torch.rand(L, V, generator=g) < 0.5] = float("-inf")
        x[0, :7] = float("nan")
        x[1] = float("nan")
        x[2 % L, 11] = float("inf")
        x[3 % L] = 0.0
        return x
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["integer", "steps", "onehot", "special"])
def test_exact_topk_equals_the_stable_sort_at_every_rank(kind):
    """The CPU build's top K (chunk maxima, then keys on a superset) must give the stable sort's
    ids and log-probabilities bit for bit at every rank, ties included, on vocabularies big enough
    to take that path (a plain torch.topk would order the planted ties arbitrarily)."""
    from ddtree_bench.engine.tree_vector import _topk_logprobs, exact_topk_logprobs

    g = torch.Generator().manual_seed(7)
    for V, k in [(40000, 64), (40000, 600), (151936, 1024), (5000, 3)]:
        x = planted_ties(kind, 4, V, g)
        want_lp, want_ids = _topk_logprobs(x, k)
        got_lp, got_ids = exact_topk_logprobs(x, k)
        assert torch.equal(got_ids, want_ids), (kind, V, k)
        assert torch.equal(got_lp, want_lp), (kind, V, k)


@pytest.mark.parametrize("kind", ["integer", "steps", "onehot", "special"])
def test_cpu_build_equals_the_heap_on_large_vocabularies(kind):
    """build_tree_fast on a CPU (exact top K + heap) against build_tree (stable sort + heap) node for
    node, and against the vectorised SortedTreeBuilder the GPU path runs."""
    from ddtree_bench.engine.tree_vector import SortedTreeBuilder

    g = torch.Generator().manual_seed(11)
    for L, V, budget in [(4, 30000, 1), (4, 30000, 77), (5, 30000, 300), (3, 151936, 1024)]:
        x = planted_ties(kind, L, V, g)
        slow, fast = build_tree(x, budget), build_tree_fast(x, budget)
        assert tree_tuple(fast) == tree_tuple(slow), (kind, L, V, budget)
        ref = SortedTreeBuilder(L, V, budget, "cpu")(x)
        assert [t.tolist() for t in ref] == list(tree_tuple(fast))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp32_logits_turns_nan_to_minus_inf_keeps_infinities_and_never_writes_its_input(dtype):
    from ddtree_bench.engine.tree_vector import fp32_logits

    x = torch.randn(3, 50).to(dtype)
    x[0, :4] = float("nan")
    x[1, :2] = float("inf")
    x[2, :2] = float("-inf")
    before = x.clone()
    got = fp32_logits(x)
    want = torch.where(torch.isnan(x.float()), float("-inf"), x.float())
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert torch.equal(x.isnan(), before.isnan()) and got.data_ptr() != x.data_ptr()   # the input keeps its NaNs
