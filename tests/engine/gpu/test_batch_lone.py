"""A request alone on an empty batch runs through the single loop (BatchFastLoop.run_alone: FastLoop.generate on
slot 0's buffers, what `serve --max-batch 1` runs) and, when others arrive, joins the batch between two rounds.

On a CPU (eager, the code the GPU captures), with the seeded random pair: for AR, DFlash and DDTree 16, greedy and
sampled, a request runs alone for three rounds, is handed over, and three more join it; every request's output,
finish reason, acceptance lengths and accepted nodes must equal its batch-1 run (`Engine.generate`, the plain loop),
and the rounds it ran alone count as rounds of one. Through `BatchScheduler` the same happens with the arrivals made
by the lone request's own third chunk, with the lone path on and off (its twin: every round batched). A lone request
whose client goes away (its on_chunk raises) or that is cancelled ends alone, the rounds it ran counted; the next
one is served. The reverse (resume_alone): the last request of a batch goes back to the single loop, hands over again
when others arrive, and equals batch 1; a resumed request that fails or is cancelled ends with its rounds counted;
through the scheduler, a long request whose short batch-mates ended finishes in the single loop, no batched step.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch
from batch_support import RANDOM_VOCAB, alone, assert_same, make_requests
from engine_support import one_torch_thread  # noqa: F401 (fixture)

from ddtree_bench.engine.batch import Cancelled
from ddtree_bench.engine.batch_scheduler import BatchScheduler
from ddtree_bench.engine.gpu.batch_loop import BatchFastLoop
from ddtree_bench.engine.gpu.loop import FastLoop

CASES = [("ar", 0, 0.0), ("ar", 0, 0.8), ("dflash", 0, 0.0), ("ddtree", 16, 0.0), ("ddtree", 16, 0.8)]
IDS = [f"{m}{b or ''}-T{T:g}" for m, b, T in CASES]
LONE_ROUNDS = 3   # rounds the first request runs alone before others wait


def _loop(engine, method: str, budget: int, slots: int = 4) -> BatchFastLoop:
    return BatchFastLoop(engine.target, engine.proposer if method != "ar" else None, method, budget, slots)


def _spy(monkeypatch, cls, name: str) -> list:
    calls = []
    real = getattr(cls, name)

    def spy(self, *a, **k):
        calls.append(name)
        return real(self, *a, **k)

    monkeypatch.setattr(cls, name, spy)
    return calls


def _first_then_others(sched: BatchScheduler, first, others) -> list:
    """Submit `first`; its own chunk after LONE_ROUNDS rounds submits `others` (from the engine thread, as a server's
    event loop would between two rounds). Their Generations, first's first; the scheduler closed after."""
    futs, chunks = [], []

    def arrive(tokens):
        chunks.append(tokens)
        if len(chunks) == 1 + LONE_ROUNDS:   # the prefill's token, then one chunk a round
            futs.extend(sched.submit(r) for r in others)

    first.on_chunk = arrive
    try:
        return [sched.submit(first).result(timeout=120)] + [f.result(timeout=120) for f in futs]
    finally:
        sched.close()


@pytest.mark.parametrize("method,budget,T", CASES, ids=IDS)
def test_a_lone_request_runs_the_single_loop_then_joins_the_batch(rnd, monkeypatch, method, budget, T):
    reqs = make_requests(RANDOM_VOCAB, T, seed=12)
    first, others = reqs[2], [reqs[0], reqs[1], reqs[3]]   # the first: 31 tokens, top_p 0.9 (sampled runs)
    generate, steps = _spy(monkeypatch, FastLoop, "generate"), _spy(monkeypatch, BatchFastLoop, "step")
    loop = _loop(rnd, method, budget)
    asked = []

    def yield_to() -> bool:
        asked.append(len(steps))
        return len(asked) == LONE_ROUNDS

    assert loop.run_alone(first, yield_to) is None   # handed over
    assert generate and not steps and asked == [0] * LONE_ROUNDS   # the single loop ran, no batched step
    (st,) = loop.active
    assert st.req is first and st.slot == 0 and st.batch_sizes == [1] * LONE_ROUNDS
    assert loop.stats.rounds == len(loop.rounds) == LONE_ROUNDS
    done = {}
    for r in others:
        assert loop.admit(r) is None
    while loop.active:
        done.update({d.request.key: d for d in loop.step()})
    for r in [first] + others:
        g = done[r.key].generation
        assert_same(g, alone(rnd, method, budget, r), ("lone-then-batch", method, T, r.key))
        assert g.stage_ns["verify"] > 0 and g.stage_ns["prefill"] > 0
    sizes = done[first.key].generation.batch_sizes
    assert sizes[:LONE_ROUNDS] == [1] * LONE_ROUNDS and max(sizes[LONE_ROUNDS:]) == 4
    assert loop.stats.rounds == len(loop.rounds)


@pytest.mark.parametrize("method,budget,T", CASES[::2], ids=IDS[::2])
def test_a_lone_request_that_nobody_joins_is_the_single_loop_to_its_end(rnd, monkeypatch, method, budget, T):
    """Run to its end alone (twice on one loop), then a batch on the same loop: all equal batch 1; the lone runs
    made no batched step and their rounds count as rounds of one."""
    reqs = make_requests(RANDOM_VOCAB, T, seed=13)
    steps = _spy(monkeypatch, BatchFastLoop, "step")
    loop = _loop(rnd, method, budget)
    for r in reqs[:2]:
        done = loop.run_alone(r, lambda: False)
        ref = alone(rnd, method, budget, r)
        assert_same(done.generation, ref, ("lone", method, r.key))
        assert done.generation.batch_sizes == [1] * len(ref.accept_lengths) and not loop.active
    assert not steps and loop.stats.rounds == len(loop.rounds) == sum(
        len(alone(rnd, method, budget, r).accept_lengths) for r in reqs[:2])
    for r, g in zip(reqs[2:], loop.run(reqs[2:])):
        assert_same(g, alone(rnd, method, budget, r), ("batch-after-lone", method, r.key))


@pytest.mark.parametrize("lone", [True, False], ids=["lone", "batched"])
@pytest.mark.parametrize("method,budget", [("ar", 0), ("ddtree", 16)], ids=["ar", "ddtree16"])
def test_the_scheduler_hands_a_lone_request_over_when_others_arrive(rnd, monkeypatch, method, budget, lone):
    """The first request's third chunk submits three more (from the engine thread, as a server's event loop would
    between two rounds): with the lone path it ran through the single loop until then and every round after is
    batched; without it every round is a batched step. Outputs equal batch 1 either way."""
    reqs = make_requests(RANDOM_VOCAB, 0.8, seed=14)
    first, others = reqs[2], [reqs[0], reqs[1], reqs[3]]
    alones = _spy(monkeypatch, BatchFastLoop, "run_alone")
    sched = BatchScheduler(_loop(rnd, method, budget), lone=lone)
    got = _first_then_others(sched, first, others)
    for r, g in zip([first] + others, got):
        assert_same(g, alone(rnd, method, budget, r), ("scheduler-lone", method, lone, r.key))
    assert len(alones) == (1 if lone else 0)
    sizes = got[0].batch_sizes
    assert sizes[:LONE_ROUNDS] == [1] * LONE_ROUNDS and max(sizes) == 4 and sched.stats.admitted == 4


def test_a_lone_request_that_fails_or_is_cancelled_ends_alone_and_the_next_is_served(rnd):
    reqs = make_requests(RANDOM_VOCAB, 0.0, seed=15)
    sched = BatchScheduler(_loop(rnd, "ddtree", 16))
    n = {"chunks": 0}
    gone = threading.Event()

    def bad(tokens):
        n["chunks"] += 1
        if n["chunks"] == 3:
            raise ConnectionError("client went away")

    def then_gone(tokens):
        gone.set()

    reqs[0].on_chunk = bad
    reqs[2].on_chunk, reqs[2].cancelled = then_gone, gone.is_set
    try:
        with pytest.raises(ConnectionError):
            sched.submit(reqs[0]).result(timeout=120)
        with pytest.raises(Cancelled):
            sched.submit(reqs[2]).result(timeout=120)
        for r in (reqs[1], reqs[3]):
            assert_same(sched.submit(r).result(timeout=120), alone(rnd, "ddtree", 16, r), ("after-failure", r.key))
    finally:
        sched.close()
    assert not sched.loop.active and torch.equal(sched.loop.live, torch.zeros_like(sched.loop.live))
    # rounds that ran count, a failed request's too: reqs[0] read two rounds before its third chunk raised (the
    # round queued ahead of that chunk was never read), reqs[2] one before its cancellation was seen
    served = sum(len(alone(rnd, "ddtree", 16, r).accept_lengths) for r in (reqs[1], reqs[3]))
    assert sched.loop.stats.rounds == len(sched.loop.rounds) == 2 + 1 + served


def _batched_until_one_is_left(loop: BatchFastLoop, reqs) -> dict:
    """Admit `reqs`, step until one request is left, then one more step alone in the batch (its round of one, which
    queues the next draft for the solo loop) until nothing of it is in flight; the retired ones by key."""
    done = {}
    for r in reqs:
        assert loop.admit(r) is None
    while len(loop.active) > 1:
        done.update({d.request.key: d for d in loop.step()})
    done.update({d.request.key: d for d in loop.step()})
    while loop.active and not loop.can_resume_alone:
        done.update({d.request.key: d for d in loop.step()})
    return done


@pytest.mark.parametrize("method,budget,T", CASES, ids=IDS)
def test_the_last_request_of_a_batch_goes_back_to_the_single_loop(rnd, monkeypatch, method, budget, T):
    """A long and a short request batched; once the short one has ended, the long one goes on through FastLoop.resume
    (the solo loop, no batched step), hands over again when asked after two rounds, a third request joins, and the
    rest is batched: every output equals batch 1, the long one's rounds alone count as rounds of one, every round
    is counted once, logit gaps included. DFlash / DDTree resume with the draft the batch's last round of one queued
    for them."""
    reqs = make_requests(RANDOM_VOCAB, T, seed=16, gaps=True)
    long_, short, third = reqs[2], reqs[1], reqs[3]   # 31, 9 and 17 new tokens
    calls = []
    real = FastLoop.resume
    monkeypatch.setattr(FastLoop, "resume", lambda self, *a, **k: calls.append(a[-1]) or real(self, *a, **k))
    loop = _loop(rnd, method, budget)
    loop.lone_resumes = True
    done = _batched_until_one_is_left(loop, [long_, short])
    assert short.key in done and loop.can_resume_alone
    (st,) = loop.active
    before, rounds_before = len(st.batch_sizes), loop.stats.rounds
    steps = _spy(monkeypatch, BatchFastLoop, "step")
    asked = []

    def yield_to() -> bool:
        asked.append(len(steps))
        return len(asked) == 2

    assert loop.resume_alone(yield_to) is None   # handed over again
    assert len(calls) == 1 and (calls[0] is not None) == (method != "ar") and asked == [0, 0]
    (back,) = loop.active   # slot 0 of the batch again
    assert back.req is long_ and back.slot == 0 and back.batch_sizes[before:] == [1, 1]
    assert loop.stats.rounds == rounds_before + 2
    assert loop.admit(third) is None
    while loop.active:
        done.update({d.request.key: d for d in loop.step()})
    for r in (long_, short, third):
        g, ref = done[r.key].generation, alone(rnd, method, budget, r)
        assert_same(g, ref, ("resumed", method, T, r.key))
        assert g.logit_gaps == pytest.approx(ref.logit_gaps, abs=1e-4), ("gaps", method, T, r.key)
    sizes = done[long_.key].generation.batch_sizes
    assert 2 in sizes[:before] and sizes[before : before + 2] == [1, 1] and max(sizes[before + 2 :]) == 2
    assert loop.stats.rounds == len(loop.rounds)


@pytest.mark.parametrize("how", ["error", "cancelled"])
@pytest.mark.parametrize("method,budget", [("ar", 0), ("ddtree", 16)], ids=["ar", "ddtree16"])
def test_a_resumed_request_that_fails_ends_with_its_error_and_its_rounds_counted(rnd, method, budget, how):
    reqs = make_requests(RANDOM_VOCAB, 0.0, seed=17)
    long_, short = reqs[2], reqs[1]
    chunks = []
    gone = threading.Event()
    last_chunk = {}

    def on_chunk(tokens):
        chunks.append(tokens)
        if len(chunks) == last_chunk.get("n"):
            if how == "error":
                raise ConnectionError("client went away")
            gone.set()

    long_.on_chunk = on_chunk
    long_.cancelled = gone.is_set
    loop = _loop(rnd, method, budget)
    loop.lone_resumes = True
    _batched_until_one_is_left(loop, [long_, short])
    rounds_before = loop.stats.rounds
    last_chunk["n"] = len(chunks) + 2   # the second round alone raises (or sets the flag the third one sees)
    done = loop.resume_alone(lambda: False)
    assert done.generation is None and isinstance(done.error, ConnectionError if how == "error" else Cancelled)
    assert not loop.active and loop.stats.rounds == len(loop.rounds) == rounds_before + (2 if how == "error" else 3)


@pytest.mark.parametrize("lone", [True, False], ids=["lone", "batched"])
@pytest.mark.parametrize("method,budget", [("ar", 0), ("ddtree", 16)], ids=["ar", "ddtree16"])
def test_the_scheduler_takes_the_last_request_back_to_the_single_loop(rnd, monkeypatch, method, budget, lone):
    """A long request runs alone; two short ones arrive after its third round, are batched with it and end; the
    long one then finishes in the single loop (resume_alone) with the lone path on, in batched steps without it.
    Outputs equal batch 1 either way."""
    reqs = make_requests(RANDOM_VOCAB, 0.8, seed=18)
    first = reqs[2]
    others = [dataclasses.replace(r, max_new_tokens=4) for r in (reqs[0], reqs[3])]
    resumes = _spy(monkeypatch, BatchFastLoop, "resume_alone")
    steps = []
    sched = BatchScheduler(_loop(rnd, method, budget), lone=lone)
    real_step = sched.loop.step
    sched.loop.step = lambda *a, **k: steps.append(len(sched.loop.active)) or real_step(*a, **k)
    got = _first_then_others(sched, first, others)
    for r, g in zip([first] + others, got):
        assert_same(g, alone(rnd, method, budget, r), ("scheduler-resume", method, lone, r.key))
    sizes = got[0].batch_sizes
    assert sizes[:LONE_ROUNDS] == [1] * LONE_ROUNDS and max(sizes) == 3 and sizes[-1] == 1
    if lone:   # no batched step of the first alone, but AR's one round in flight read after the short ones ended
        assert len(resumes) == 1 and steps.count(1) == (1 if method == "ar" else 0)
    else:      # every round of the first alone is a batched step (AR: one may be read from a round queued for three)
        assert not resumes and steps.count(1) >= sizes.count(1) - (1 if method == "ar" else 0)
