"""The batched fast loop on a GPU with CUDA graphs against batch 1: random-drafter batches in fp32
(token for token, round for round, T = 0 and T > 0 seeded) and bf16 (up to near-ties), the trained
toy drafter in fp32, and every stage of every bucket used captured and replayed. Needs CUDA; skips
cleanly without it (the CPU twins in test_batch_loop.py carry the equality tests in CI)."""

from __future__ import annotations

import pytest
import torch

from ddtree_bench.engine.batch import BatchRequest
from ddtree_bench.engine.generate import Engine
from ddtree_bench.engine.gpu.batch_loop import BatchFastLoop
from ddtree_bench.engine.loading import load_drafter, load_target, random_pair
from ddtree_bench.pair import TOY_DIR
from engine_support import same_generation

VOCAB = 272
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
POINTS = (("ar", 0), ("dflash", 0), ("ddtree", 16), ("ddtree", 128))


def requests(vocab: int, T: float, text: bool = False) -> list[BatchRequest]:
    g = torch.Generator().manual_seed(11)
    texts = ("Q: 2+3? A:", "The cat sat on the", "Once upon a time, in a small", "x", "Hello, my name is")
    out = []
    for i, (n, m) in enumerate(zip((40, 7, 23, 61, 12), (48, 20, 64, 33, 1))):
        prompt = list(texts[i].encode()) if text else torch.randint(0, vocab - 2, (n,), generator=g).tolist()
        out.append(BatchRequest(prompt, m, temperature=T if i != 1 else 0.0, seed=500 + i, top_p=0.9 if i == 2 else 1.0,
                                record_trees=True, key=i))
    return out


def alone(engine: Engine, method: str, budget: int, r: BatchRequest, gaps: bool = False):
    return engine.generate(r.prompt_ids, method, budget, r.max_new_tokens, r.temperature, r.top_p, r.seed, r.stop_ids,
                           return_logit_gaps=gaps)


def assert_captured(loop: BatchFastLoop) -> None:
    assert loop.graphs and loop._stages
    assert all(s.captured for bk in loop._stages.values() for s in bk.stages.values())


@pytest.mark.parametrize("T", [0.0, 0.8], ids=["T0", "T0.8"])
def test_graph_captured_batches_equal_batch1_fp32(T):
    target, drafter = random_pair(seed=0, vocab_size=VOCAB, dtype="float32", device="cuda")
    plain = Engine(target, drafter)
    for method, budget in POINTS:
        reqs = requests(VOCAB, T)
        loop = BatchFastLoop(plain.target, plain.proposer, method, budget, 3)
        for i in range(2):   # the second pass replays the captured graphs
            got = loop.run(reqs)
            for r, g in zip(reqs, got):
                same_generation(g, alone(plain, method, budget, r))
        assert_captured(loop)
        assert {r["bucket"] for r in loop.rounds} >= {1, 3}
        if method == "ddtree":   # batched rounds built by the slotted kernel of the budget's rule (builders.batched_kernel)
            want = {16: "triton-block-slotted", 128: "triton-grid-keys-slotted"}[budget]
            assert loop.tree_builder == want, loop.tree_builder
            assert loop.redone_rounds == 0


@pytest.mark.parametrize("T", [0.0, 0.8], ids=["T0", "T0.8"])
def test_flagged_slotted_rounds_are_redone_exactly_on_cuda(monkeypatch, T):
    """The real slotted kernel, guarded Triton walk/commit and exact redo on the GPU (eager, so a flag can be forced
    on chosen calls: wrong trees and a raised device flag, as the kernel gives on exact ties): every request still
    equals batch 1 in fp32, sampled ones too (their CUDA generators restored before the redo's draw)."""
    from ddtree_bench.engine.gpu import builders
    from ddtree_bench.engine.gpu.batch_tree import BatchTrees

    real = builders.checked_slotted
    made = []

    class Flaky:
        def __init__(self, inner):
            self.inner, self.flag, self.name, self.N, self.calls = inner, inner.flag, inner.name, inner.N, 0

        def __call__(self, logits):
            self.calls += 1
            t = self.inner(logits)
            if self.calls in (1, 2, 4, 7):
                self.flag.add_(1)
                return BatchTrees(t.token_ids.flip(1), t.parents, t.depths)
            return t

    def flaky(*a, **kw):
        made.append(Flaky(real(*a, **kw)))
        return made[-1]

    monkeypatch.setattr(builders, "checked_slotted", flaky)
    target, drafter = random_pair(seed=0, vocab_size=VOCAB, dtype="float32", device="cuda")
    plain = Engine(target, drafter)
    reqs = requests(VOCAB, T)
    loop = BatchFastLoop(plain.target, plain.proposer, "ddtree", 16, 3, graphs=False)
    got = loop.run(reqs)
    for r, g in zip(reqs, got):
        same_generation(g, alone(plain, "ddtree", 16, r))
    assert made[0].calls >= 7 and loop._redone == 4


def test_graph_captured_batches_bf16_up_to_near_ties():
    """bf16: batched GEMMs and batch-1 GEMMs round differently, so greedy outputs agree only up to
    near-ties: the first divergence, if any, must sit where batch 1's top-1/top-2 logit gap is below
    the project's near-tie threshold."""
    from ddtree_bench.defaults import NEAR_TIE_GAP

    target, drafter = random_pair(seed=0, vocab_size=VOCAB, dtype="bfloat16", device="cuda")
    plain = Engine(target, drafter)
    for method, budget in POINTS:
        reqs = requests(VOCAB, 0.0)
        loop = BatchFastLoop(plain.target, plain.proposer, method, budget, 4)
        got = loop.run(reqs)
        for r, g in zip(reqs, got):
            a = alone(plain, method, budget, r, gaps=True)
            diff = next((i for i, (x, y) in enumerate(zip(a.output_ids, g.output_ids)) if x != y), None)
            if diff is None:
                assert a.output_ids == g.output_ids
            else:
                assert a.logit_gaps[diff] < NEAR_TIE_GAP, f"{method}{budget} diverged at {diff}, gap {a.logit_gaps[diff]}"
        assert_captured(loop)


def test_trained_toy_drafter_batches_equal_batch1_fp32():
    target = load_target(TOY_DIR / "target", "float32", "cuda")
    drafter = load_drafter(TOY_DIR / "draft", target.cfg, "float32", "cuda")
    plain = Engine(target, drafter)
    for method, budget in (("dflash", 0), ("ddtree", 32)):
        reqs = requests(target.cfg.vocab_size, 0.0, text=True)
        got = BatchFastLoop(plain.target, plain.proposer, method, budget, 5).run(reqs)
        for r, g in zip(reqs, got):
            same_generation(g, alone(plain, method, budget, r))
        assert max(a for g in got for a in g.accept_lengths) >= 4   # a drafter that accepts: deep paths ran


@pytest.mark.parametrize("method,budget", [("ar", 0), ("dflash", 0), ("ddtree", 16), ("ddtree", 128)])
def test_one_request_at_a_time_runs_the_single_fast_loop_bit_for_bit_bf16(method, budget):
    """A batched loop of 4 slots that sees one request at a time (serve --max-batch 4 at concurrency 1) runs the
    single fast loop's stages on slot 0 - the same Triton builder, kernels and bf16 rounding - so its tokens and
    per-round acceptance equal the single fast loop's exactly, not only up to near-ties, and every round ran there."""
    target, drafter = random_pair(seed=0, vocab_size=VOCAB, dtype="bfloat16", device="cuda")
    fast = Engine(target, drafter, cuda_graphs=True)
    loop = BatchFastLoop(fast.target, fast.proposer, method, budget, 4)
    for r in requests(VOCAB, 0.0):
        got = loop.run([r])[0]
        want = fast.generate(r.prompt_ids, method, budget, r.max_new_tokens, r.temperature, r.top_p, r.seed, r.stop_ids)
        assert got.output_ids == want.output_ids and got.accept_lengths == want.accept_lengths, (method, budget, r.key)
    assert loop.rounds and {r["bucket"] for r in loop.rounds} == {1} and not loop._stages
    assert loop.solo is not None and loop.solo.buckets


@pytest.mark.parametrize("T", [0.0, 0.8], ids=["T0", "T0.8"])
def test_a_lone_request_hands_over_to_a_captured_batch_fp32(T):
    """serve --max-batch N's lone path on a GPU (BatchFastLoop.run_alone: the single loop's captured graphs on slot 0's
    buffers): a request runs alone for three rounds, is handed over, three more join it; every request equals batch
    1, the lone rounds ran no batched stage and the rounds after them were captured batched rounds."""
    target, drafter = random_pair(seed=0, vocab_size=VOCAB, dtype="float32", device="cuda")
    plain = Engine(target, drafter)
    for method, budget in POINTS:
        reqs = requests(VOCAB, T)
        first, others = reqs[2], [reqs[0], reqs[1], reqs[3]]
        loop = BatchFastLoop(plain.target, plain.proposer if method != "ar" else None, method, budget, 4)
        asked = []
        assert loop.run_alone(first, lambda: asked.append(1) or len(asked) == 3) is None
        assert not loop._stages and loop.stats.rounds == 3
        for r in others:
            assert loop.admit(r) is None
        done = {}
        while loop.active:
            done.update({d.request.key: d.generation for d in loop.step()})
        for r in [first] + others:
            same_generation(done[r.key], alone(plain, method, budget, r))
        assert done[first.key].batch_sizes[:3] == [1, 1, 1] and max(done[first.key].batch_sizes) == 4
        assert_captured(loop)


@pytest.mark.parametrize("T", [0.0, 0.8], ids=["T0", "T0.8"])
def test_the_last_request_of_a_captured_batch_goes_back_to_the_single_loop_fp32(T):
    """BatchFastLoop.resume_alone on a GPU (what the scheduler runs when a step leaves one request): a long and a short
    request in captured batched rounds; once the short one has ended, the long one goes on in the single loop's
    captured graphs on slot 0's buffers (FastLoop.resume, with the draft its last round of one queued) for two rounds,
    hands over again, a third joins, and it ends batched; every request equals batch 1."""
    target, drafter = random_pair(seed=0, vocab_size=VOCAB, dtype="float32", device="cuda")
    plain = Engine(target, drafter)
    for method, budget in POINTS:
        reqs = requests(VOCAB, T)
        long_, short, third = reqs[2], reqs[1], reqs[3]   # 64, 20 and 33 new tokens
        loop = BatchFastLoop(plain.target, plain.proposer if method != "ar" else None, method, budget, 4)
        loop.lone_resumes = True
        for r in (long_, short):
            assert loop.admit(r) is None
        done = {}
        while loop.active and (len(loop.active) > 1 or not loop.can_resume_alone):
            done.update({d.request.key: d.generation for d in loop.step()})
        assert short.key in done and len(loop.active) == 1
        before = len(loop.active[0].batch_sizes)
        asked = []
        assert loop.resume_alone(lambda: asked.append(1) or len(asked) == 2) is None
        assert loop.active[0].batch_sizes[before:] == [1, 1]
        assert loop.admit(third) is None
        while loop.active:
            done.update({d.request.key: d.generation for d in loop.step()})
        for r in (long_, short, third):
            same_generation(done[r.key], alone(plain, method, budget, r))
        assert_captured(loop)
