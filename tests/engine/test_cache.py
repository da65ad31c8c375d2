"""The preallocated KV cache: compaction moves exactly the accepted rows, and after every DDTree
round the cache rows [0, frontier) equal those of a fresh forward over the committed sequence."""

from __future__ import annotations

import pytest
import torch

from ddtree_bench.engine.cache import KVCache
from ddtree_bench.engine.generate import Engine
from ddtree_bench.engine.loading import random_pair
from engine_support import RiggedProposer, greedy_reference, one_torch_thread  # noqa: F401 (fixture)


def test_compact_moves_accepted_rows_in_every_layer():
    g = torch.Generator().manual_seed(0)
    for keep in ([0], [0, 1, 2], [0, 2, 5], [0, 1, 4, 5, 9], [0, 3, 4, 5, 6, 7, 8, 9, 10, 11]):
        c = KVCache(layers=3, kv_heads=2, head_dim=4, capacity=30, dtype=torch.float32, device=torch.device("cpu"))
        c.k.copy_(torch.randn(c.k.shape, generator=g))
        c.v.copy_(torch.randn(c.v.shape, generator=g))
        k0, v0, start = c.k.clone(), c.v.clone(), 7
        c.compact(start, torch.tensor(keep))
        n = len(keep)
        src = torch.tensor(keep) + start
        assert torch.equal(c.k[:, :, start : start + n], k0[:, :, src])
        assert torch.equal(c.v[:, :, start : start + n], v0[:, :, src])
        assert torch.equal(c.k[:, :, :start], k0[:, :, :start]) and torch.equal(c.v[:, :, :start], v0[:, :, :start])
    c.compact(3, torch.zeros(0, dtype=torch.long))  # nothing accepted: nothing moves, no error


def test_write_past_capacity_fails_loudly():
    c = KVCache(1, 1, 2, 4, torch.float32, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="overflow"):
        c.write(0, 3, torch.zeros(1, 2, 2), torch.zeros(1, 2, 2))


@pytest.mark.parametrize("budget", [16, 64, 300])
def test_cache_after_every_round_equals_fresh_forward(budget):
    target, _ = random_pair(seed=0)
    prompt = list(range(3, 12))
    truth = prompt + greedy_reference(target, prompt, 90)
    checked = {"rounds": 0}
    engine = None

    def check(start: int, draft_len: int) -> None:
        # called at the draft step of each round: the cache holds exactly the committed tokens [0, start)
        fresh = target.new_cache(start)
        target(torch.tensor(truth[:start]), torch.arange(start), fresh, 0)
        got = engine._tcache
        for layer in range(target.cfg.num_hidden_layers):
            torch.testing.assert_close(got.k[layer, :, :start], fresh.k[layer, :, :start], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got.v[layer, :, :start], fresh.v[layer, :, :start], atol=1e-5, rtol=1e-5)
        checked["rounds"] += 1

    rig = RiggedProposer(truth, 64, (1, 2), seed=7, on_propose=check)
    engine = Engine(target, fast=True, proposer=rig)
    g = engine.generate(prompt, "ddtree", budget, max_new_tokens=60, record_trees=True)
    assert g.output_ids == truth[len(prompt):][:60]
    non_prefix = sum(t.accepted != list(range(len(t.accepted))) for t in g.trees)
    assert non_prefix >= 2 and checked["rounds"] == len(g.accept_lengths)
    check(len(prompt) + sum(g.accept_lengths), 0)  # and after the last round's compaction
