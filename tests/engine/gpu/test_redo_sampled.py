"""A flagged round of the single fast loop (gpu/loop.FastLoop) at temperature > 0: the round's discarded draw must not
move the request's generator on, or the exact redo draws other samples than an unflagged round and the output leaves
the plain loop's (batch 1 equality at T > 0 is a contract: engine/batch.py). CPU: a builder stand-in raises its
certificate flag on chosen calls, as the Triton kernels do on exact ties (the batched loop's twin of this test is in
test_batch_loop.py)."""

from __future__ import annotations

import pytest
import torch

from ddtree_bench.engine.generate import Engine
from ddtree_bench.engine.gpu.loop import FastLoop
from ddtree_bench.engine.loading import random_pair
from ddtree_bench.engine.tree_vector import StaticTreeBuilder
from engine_support import one_torch_thread, same_generation  # noqa: F401 (fixture)

VOCAB = 272


class _Flaky(StaticTreeBuilder):
    """The exact tree, except on the calls in `flagged`: a wrong tree (reversed tokens as a chain) and a raised flag."""

    def __init__(self, *a, flagged: set[int]):
        super().__init__(*a)
        self.flag = torch.zeros(1, dtype=torch.int32)
        self.calls, self.flagged = 0, flagged

    def __call__(self, logits):
        self.calls += 1
        tok, par, dep = super().__call__(logits)
        if self.calls in self.flagged:
            self.flag += 1
            return tok.flip(0), torch.arange(tok.numel()), torch.arange(1, tok.numel() + 1).clamp(max=self.L)
        return tok, par, dep


@pytest.mark.parametrize("drafter", [True, False], ids=["dflash-drafter", "host-proposer"])
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_a_flagged_sampled_round_draws_what_an_unflagged_round_draws(monkeypatch, drafter, top_p):
    target, d = random_pair(seed=0, vocab_size=VOCAB)
    made = []

    def flaky(self, budget, kind):
        if kind == "torch":
            return StaticTreeBuilder(self.L, self.target.cfg.vocab_size, budget, self.device)
        made.append(_Flaky(self.L, self.target.cfg.vocab_size, budget, self.device, flagged={1, 3, 4, 7, 33, 34}))
        return made[-1]

    monkeypatch.setattr(FastLoop, "_builder", flaky)
    plain = Engine(target, d)
    fast = Engine(target, d, cuda_graphs=True) if drafter else Engine(target, proposer=plain.proposer, cuda_graphs=True)
    prompt = [5, 17, 101, 33, 2, 250]
    for seed in (3, 4):
        a = plain.generate(prompt, "ddtree", 16, 30, temperature=0.9, top_p=top_p, seed=seed)
        b = fast.generate(prompt, "ddtree", 16, 30, temperature=0.9, top_p=top_p, seed=seed)
        same_generation(a, b)
    assert fast.fast_loop().redone_rounds == 6 and made[0].calls >= 40   # flagged rounds in both generations
