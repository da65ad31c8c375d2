"""The CPU tree build (`tree_cpu.build_tree_cpu`, what `build_tree_fast` runs on a CPU) against the
heap over the full stable sort (`tree.build_tree`), node for node, on logits full of exact ties.

The tie rule must hold at every rank inside the top K, not only at its boundary: equal logits rank by
ascending token id (the stable sort), and equal scores by the lexicographic rank tuple. The lazy
loads add boundaries of their own (ranks 64 and 1024, where a depth's loaded ranks grow), so tie
groups are planted across those too, and each case runs at one and at two torch threads (the
normaliser's reduction splits differently with threads).
"""

from __future__ import annotations

import pytest
import torch

from ddtree_bench.engine import tree_cpu
from ddtree_bench.engine.tree import Tree, build_tree, build_tree_fast
from ddtree_bench.engine.tree_cpu import build_tree_cpu, row_topk_ids
from ddtree_bench.engine.tree_vector import fp32_logits


def as_lists(tree: Tree) -> tuple[list[int], list[int], list[int]]:
    return tree.token_ids.tolist(), tree.parents.tolist(), tree.depths.tolist()


def logits_of(kind: str, L: int, V: int, g: torch.Generator) -> torch.Tensor:
    """[L, V] fp32 draft logits of one kind; all but "random" are full of exact ties."""
    if kind == "random":         # real-looking: distinct values, depth 1 takes most of a large budget
        return torch.randn(L, V, generator=g) * 3
    if kind == "peaked":         # a trained drafter: a few likely tokens per depth, a deep tree
        x = torch.randn(L, V, generator=g)
        x[torch.arange(L), torch.randint(0, V, (L,), generator=g)] += 12.0
        return x
    if kind == "coarse":         # rounded to quarters: ties at every rank
        return (torch.randn(L, V, generator=g) * 4).round() / 4
    if kind == "integer":        # ~V/40 tokens share each value
        return torch.randint(0, 40, (L, V), generator=g).float()
    if kind == "onehot":         # one token per depth, every other logit tied at 0
        x = torch.zeros(L, V)
        x[torch.arange(L), torch.randint(0, V, (L,), generator=g)] = 5.0
        return x
    if kind == "boundary":       # tie groups straddling ranks 64 and 1024 (the lazy loads' edges), scattered ids
        x = torch.randn(L, V, generator=g) - 20.0
        for d in range(L):
            ids = torch.randperm(V, generator=g)
            x[d, ids[:40]] = 9.0                      # ranks 0..39
            x[d, ids[40:100]] = 8.0                   # ranks 40..99: across 64
            mid = ids[100:1000]
            x[d, mid] = 7.5 - torch.arange(mid.numel()) / 1000
            x[d, ids[1000:1100]] = 6.0                # ranks 1000..1099: across 1024
        return x
    if kind == "special":        # -inf masks, a NaN row, NaN entries, +inf, a flat row
        x = torch.randn(L, V, generator=g).round()
        x[torch.rand(L, V, generator=g) < 0.5] = float("-inf")
        x[0, :7] = float("nan")
        x[1 % L] = float("nan")
        x[2 % L, 11 % V] = float("inf")
        x[3 % L] = 0.0
        return x
    raise ValueError(kind)


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    n = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(n)


KINDS = ["random", "peaked", "coarse", "integer", "onehot", "boundary", "special"]


@pytest.mark.parametrize("kind", KINDS)
def test_row_topk_is_the_stable_sort_at_every_rank(kind):
    """Ids of the top k of one row, ties by ascending id, at k on both sides of the load edges."""
    g = torch.Generator().manual_seed(1)
    for V, ks in [(151936, (1, 63, 64, 65, 1024, 1100)), (30000, (7, 500)), (300, (3, 300))]:
        x = fp32_logits(logits_of(kind, 2, V, g))
        for d in range(2):
            want = torch.sort(x[d], descending=True, stable=True).indices
            for k in ks:
                assert row_topk_ids(x[d], k).tolist() == want[:k].tolist(), (kind, V, k)


CASES = [(15, 151936, 64), (15, 151936, 1024), (4, 151936, 1100), (4, 30000, 1), (5, 30000, 300),
         (15, 256, 1024), (3, 4096, 5000), (2, 17, 100)]


@pytest.mark.parametrize("kind", KINDS)
def test_cpu_build_equals_the_heap(kind, threads):
    """Node for node (tokens, parents, depths, in pop order) the heap over the full stable sort, on
    real vocabularies (lazy loads) and small ones (every depth at once), budgets above V included."""
    g = torch.Generator().manual_seed(5)
    for L, V, budget in CASES:
        x = logits_of(kind, L, V, g)
        assert as_lists(Tree(*build_tree_cpu(x, budget))) == as_lists(build_tree(x, budget)), (kind, L, V, budget)


def test_build_tree_fast_on_a_cpu_is_the_lazy_build_and_keeps_the_thread_count(threads):
    g = torch.Generator().manual_seed(9)
    x = logits_of("coarse", 15, 151936, g)
    assert as_lists(build_tree_fast(x, 256)) == as_lists(build_tree(x, 256))
    assert torch.get_num_threads() == threads


def test_the_callers_logits_are_not_written_and_half_precision_reads_as_fp32():
    g = torch.Generator().manual_seed(3)
    x = logits_of("special", 6, 40000, g)
    before = x.clone()
    tree = Tree(*build_tree_cpu(x, 300))
    assert torch.equal(x.isnan(), before.isnan()) and torch.equal(x.nan_to_num(), before.nan_to_num())
    assert as_lists(tree) == as_lists(build_tree(before, 300))
    h = (torch.randn(5, 40000, generator=g) * 3).half()
    assert as_lists(Tree(*build_tree_cpu(h, 500))) == as_lists(build_tree(h, 500))


def test_a_depth_is_loaded_only_as_far_as_the_heap_reads():
    """The point of the build: at B = 1024 on random logits the tree reaches a few depths and the
    deep ones are never read past a first load (the plain build took the top 1024 of all 15)."""
    g = torch.Generator().manual_seed(2)
    x = logits_of("random", 15, 151936, g)
    ranks = tree_cpu._LazyRanks(x, 1024)
    loaded = []
    real_load = ranks.load

    def spy(d, rank):
        out = real_load(d, rank)
        loaded.append((d, len(out)))
        return out

    ranks.load = spy
    tree = Tree(*tree_cpu._heap(ranks, 15, 1024, 1024))
    assert as_lists(tree) == as_lists(build_tree(x, 1024))
    depths_read = {d for d, _ in loaded}
    assert max(depths_read) <= int(tree.depths.max())          # a depth is read only below a popped node
    assert sum(n for _, n in loaded) < 15 * 1024 / 4


def test_log_probs_have_the_references_bits(threads):
    """Each loaded rank's log-prob equals the stable-sort reference's bit for bit (not only the tree),
    the reference on the caller's thread count: the build's one-row normaliser on one thread reduces
    as the reference's [L, V] call does (a one-row call on two threads splits its sum and differs)."""
    from ddtree_bench.engine.tree_vector import _topk_logprobs

    g = torch.Generator().manual_seed(4)
    # 30 and 100: most of exp(x - max) underflows (subnormal or 0), where the normaliser floors x - max at
    # EXP_FLOOR; the last set holds rows whose only mass is the max and values just around the floor
    edge = torch.full((64, 50000), -1e4)
    edge[:, : 64 * 8].view(64, 8, 64).copy_(torch.linspace(-86.0, -104.0, 64))
    edge[:, -1] = 0.0
    for x in [torch.randn(64, 50000, generator=g) * scale for scale in (1.0, 3.0, 7.0, 30.0, 100.0)] + [edge]:
        want_lp, want_ids = _topk_logprobs(x, 70)
        ranks = tree_cpu._LazyRanks(x, 70)
        for d in range(64):
            with tree_cpu._one_thread():
                got = ranks.load(d, 69)
            assert ranks.tok[d] == want_ids[d].tolist()
            assert torch.equal(torch.tensor(got), want_lp[d]), (x[d].abs().max().item(), d)
