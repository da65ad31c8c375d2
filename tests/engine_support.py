"""Helpers shared by the engine tests (not a test module): an independent greedy oracle and a
proposer rigged to draft the target's own greedy continuation with controlled errors.

The rigged proposer plugs into `Engine(proposer=...)` in place of the DFlash drafter. For the round
whose bonus token sits at absolute position `start`, it puts most of the mass of depth j on the
true token at position start + j, except that (deterministically, from a seed and `start`) some
depths put the true token second ("sibling" errors: DFlash's chain breaks there, DDTree's tree
catches it through a non-first child, which forces KV compaction of a non-prefix path) or far down
("misses": every method stops there). It also checks, on every call, that the engine's state is
right: the bonus equals the true token at `start`, and the context features handed over equal the
target's hidden states of the committed sequence computed from scratch.
"""

from __future__ import annotations

import random

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny models run fastest on one thread, and the test machine's 2 cores are shared: two
    intra-op threads per process under contention made these tests 4x slower. Restored after."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@torch.inference_mode()
def greedy_reference(target, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens by recomputing the whole sequence from scratch at every step (no cache reuse)."""
    seq = list(prompt)
    for _ in range(n):
        ids = torch.tensor(seq)
        logits, _ = target(ids, torch.arange(len(seq)), target.new_cache(len(seq)), 0, last_logits_only=True)
        seq.append(int(logits[0].argmax()))
    return seq[len(prompt):]


@torch.inference_mode()
def hidden_reference(target, seq: list[int], layers) -> torch.Tensor:
    """Target hidden states [len(seq), len(layers) * H] of a fresh causal forward over seq."""
    _, hidden = target(torch.tensor(seq), torch.arange(len(seq)), target.new_cache(len(seq)), 0, hidden_layers=tuple(layers))
    return hidden


class RiggedProposer:
    def __init__(self, truth: list[int], vocab_size: int, target_layer_ids=(1, 2), block_size: int = 16, seed: int = 0,
                 p_second: float = 0.15, p_miss: float = 0.03, exact_positions=(), ref_hidden: torch.Tensor | None = None,
                 on_propose=None):
        self.truth, self.V = list(truth), vocab_size
        self.block_size, self.target_layer_ids = block_size, tuple(target_layer_ids)
        self.seed, self.p_second, self.p_miss = seed, p_second, p_miss
        self.exact = set(exact_positions)
        self.ref_hidden = ref_hidden
        self.on_propose = on_propose
        self.calls = 0
        self.errors = {"second": 0, "miss": 0}

    def new_cache(self, capacity: int):
        return None

    def propose(self, ctx: torch.Tensor, bonus: int, cache, draft_len: int, start: int) -> torch.Tensor:
        self.calls += 1
        if start < len(self.truth):
            assert bonus == self.truth[start], f"bonus at position {start} is {bonus}, greedy says {self.truth[start]}"
        assert ctx.shape[0] == start - draft_len
        if self.ref_hidden is not None and start <= self.ref_hidden.shape[0]:
            torch.testing.assert_close(ctx, self.ref_hidden[draft_len:start], atol=1e-4, rtol=1e-4,
                                       msg=lambda m: f"drafter context for positions {draft_len}..{start - 1}: {m}")
        if self.on_propose is not None:
            self.on_propose(start, draft_len)
        L, V = self.block_size - 1, self.V
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + start)
        rng = random.Random(self.seed * 1_000_003 + start)
        logits = torch.rand(L, V, generator=g) * 2.0
        for j in range(1, L + 1):
            pos = start + j
            if pos >= len(self.truth):
                continue
            true = self.truth[pos]
            wrong = (true + 1 + rng.randrange(V - 1)) % V
            u = rng.random()
            if pos in self.exact:
                u = 1.0
            if u < self.p_miss:
                logits[j - 1, wrong], logits[j - 1, true] = 10.0, -5.0
                self.errors["miss"] += 1
            elif u < self.p_miss + self.p_second:
                logits[j - 1, wrong], logits[j - 1, true] = 10.0, 9.0
                self.errors["second"] += 1
            else:
                logits[j - 1, true] = 10.0
        return logits


class OracleProposer:
    """Drafts the target's greedy continuation: depth j of the round whose bonus sits at `start` puts
    the true token at position start + j first, except (seeded by start) sometimes second (a sibling
    acceptance in DDTree, a chain break in DFlash) or nowhere near the top (a miss)."""

    def __init__(self, prompt: list[int], truth: list[int], block_size: int = 16, layers=(1, 2), seed: int = 0,
                 vocab: int = 272):
        self.seq, self.vocab = list(prompt) + list(truth), vocab
        self.block_size, self.target_layer_ids, self.seed = block_size, tuple(layers), seed

    def new_cache(self, capacity: int):
        return None

    def propose(self, ctx, bonus: int, cache, draft_len: int, start: int) -> torch.Tensor:
        assert ctx.shape[0] == start - draft_len
        rng = random.Random(self.seed * 100003 + start)
        L = self.block_size - 1
        V = self.vocab
        logits = torch.randn(L, V, generator=torch.Generator().manual_seed(start)) * 0.5
        for j in range(1, L + 1):
            pos = start + j
            if pos >= len(self.seq):
                break
            true, u = self.seq[pos], rng.random()
            decoy = (true + 1 + rng.randrange(V - 2)) % V
            if u < 0.2:          # second choice
                logits[j - 1, decoy] = 9.0
                logits[j - 1, true] = 8.0
            elif u < 0.25:       # miss
                logits[j - 1, decoy] = 9.0
                logits[j - 1, true] = -9.0
            else:
                logits[j - 1, true] = 9.0
        return logits.to(ctx.device)


def same_generation(a, b) -> None:
    """Two Generations agree: tokens, per-round acceptance lengths, finish reason."""
    assert a.output_ids == b.output_ids
    assert a.accept_lengths == b.accept_lengths
    assert a.finish_reason == b.finish_reason
