"""The batched tree build (engine/gpu/batch_tree.py) against the per-slot PyTorch builder it batches:
every slot's (token_ids, parents, depths) equal StaticTreeBuilder's on that slot's logits, on random,
near-all-tie one-hot and coarse (ties across depths) logits, slots of different families in one batch,
several C, L, V and budgets (B = 1, B past the candidates), NaN and bf16 logits. CPU; the CUDA file
beside it checks the Triton-selection path and the Qwen3 vocabulary on a GPU."""

from __future__ import annotations

import pytest
import torch

from ddtree_bench.engine.gpu.batch_tree import BatchTreeBuilder, BatchTrees
from ddtree_bench.engine.tree import build_tree
from ddtree_bench.engine.tree_vector import StaticTreeBuilder
from triton_support import tree_logits

KINDS = ("random", "onehot", "coarse")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def batch(kinds, L: int, V: int, seed: int) -> torch.Tensor:
    return torch.stack([tree_logits(k, L, V, seed + 7 * i) for i, k in enumerate(kinds)])


def assert_per_slot(logits: torch.Tensor, budget: int) -> BatchTrees:
    C, L, V = logits.shape
    got = BatchTreeBuilder(L, V, budget, "cpu", select="torch")(logits)
    one = StaticTreeBuilder(L, V, budget, "cpu")
    assert got.token_ids.shape == got.parents.shape == got.depths.shape == (C, one.N)
    for c in range(C):
        tok, par, dep = one(logits[c])
        gt, gp, gd = got.slot(c)
        assert gt.tolist() == tok.tolist(), f"slot {c} tokens"
        assert gp.tolist() == par.tolist(), f"slot {c} parents"
        assert gd.tolist() == dep.tolist(), f"slot {c} depths"
    return got


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("C,L,V,budget", [(1, 15, 272, 16), (3, 15, 272, 64), (5, 15, 272, 200), (2, 15, 272, 1),
                                          (4, 4, 3, 50), (3, 6, 5, 7), (2, 1, 9, 4), (16, 7, 40, 33)])
def test_every_slot_equals_the_per_slot_builder(kind, C, L, V, budget):
    for seed in range(2):
        assert_per_slot(batch([kind] * C, L, V, seed), budget)


@pytest.mark.parametrize("budget", [1, 16, 48])
def test_mixed_families_in_one_batch_and_equal_slots(budget):
    """Slots see nothing of each other: a one-hot slot beside a random one, and two identical slots."""
    logits = batch(["onehot", "random", "coarse", "onehot", "random"], 15, 272, 11)
    logits[4] = logits[1]
    got = assert_per_slot(logits, budget)
    assert torch.equal(got.token_ids[4], got.token_ids[1]) and torch.equal(got.parents[4], got.parents[1])


def test_equals_the_heap_on_exact_ties():
    """The tie rule is the heap's (score desc, then rank tuple asc), not only the vectorised builder's."""
    logits = batch(["onehot", "coarse", "onehot"], 6, 5, 3)
    got = BatchTreeBuilder(6, 5, 40, "cpu")(logits)
    for c in range(3):
        heap = build_tree(logits[c], 40)
        assert got.token_ids[c].tolist() == heap.token_ids.tolist()
        assert got.parents[c].tolist() == heap.parents.tolist()
        assert got.depths[c].tolist() == heap.depths.tolist()


def test_nan_and_bf16_logits():
    logits = batch(["random", "coarse", "random"], 15, 272, 5)
    logits[0, 3, :100] = float("nan")
    logits[2, 0] = float("nan")          # a row with no finite mass
    assert_per_slot(logits, 32)
    assert_per_slot(logits.to(torch.bfloat16), 32)


def test_per_slot_twin_and_shape_checks():
    logits = batch(["coarse"] * 3, 15, 272, 9)
    b = BatchTreeBuilder(15, 272, 24, "cpu")
    fast, slow = b(logits), b.per_slot(logits)
    for name in ("token_ids", "parents", "depths"):
        assert torch.equal(getattr(fast, name), getattr(slow, name))
    assert [t[0].tolist() for t in fast.slots()] == fast.token_ids.tolist()
    assert not b.triton                  # CPU: the torch selection
    with pytest.raises(ValueError, match=r"\[C, 15, 272\]"):
        b(logits[0])
    with pytest.raises(ValueError, match="selection"):
        BatchTreeBuilder(15, 272, 24, "cpu", select="heap")
    with pytest.raises(ValueError, match="too large"):
        BatchTreeBuilder(2, 2**20, 2**16, "cpu")


DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                                    reason="needs a CUDA device")])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("V", [97, 151_936])
def test_log_normalisers_are_torch_logsumexp_bit_for_bit_one_slot_and_per_slot(device, V):
    """tree_vector.log_normalisers (every builder's normaliser; the batched one sums slot by slot) equals
    torch.logsumexp on each slot's own [L, V], bit for bit: finite rows, rows with -inf logits, a row of only -inf,
    and a whole batch at once - so a slot's log-probs are batch 1's on this device whatever the batch."""
    from ddtree_bench.engine.tree_vector import log_normalisers

    g = torch.Generator().manual_seed(V)
    x = (torch.randn(4, 15, V, generator=g) * 3).to(device)
    x[1, 3, : V // 2] = float("-inf")
    x[2, 7] = float("-inf")
    want = torch.stack([torch.logsumexp(x[c], dim=-1, keepdim=True) for c in range(4)])
    got = log_normalisers(x)
    assert got.shape == (4, 15, 1) and torch.equal(got, want)
    assert torch.equal(log_normalisers(x[3]), want[3])
    assert torch.isinf(got[2, 7]).all() and not torch.isnan(got).any()
