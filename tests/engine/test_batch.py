"""The batched plain loop is lossless: every request batched equals its batch-1 run token for token.

For each drafter (the seeded random DFlash drafter, a proposer rigged to draft each request's own
greedy continuation with controlled errors, the bundled trained toy drafter) and each method
(AR, DFlash, DDTree at several budgets), a batch of requests with mixed prompt lengths, stop ids,
max_new_tokens, temperatures (0 and > 0, one with top_p < 1) and seeds runs through
`BatchLoop` with fewer slots than requests (so requests are admitted mid-flight as others
retire); each request's output, finish reason and per-round acceptance lengths must equal what
`Engine.generate` (batch 1, `PlainLoop`) gives for it alone, in fp32. The rigged proposer runs at
T = 0 only (it checks the bonus against the greedy truth). The requests, engines and references
come from tests/batch_support.py (each reference computed once per session, shared with
tests/engine/gpu/test_batch_loop.py). `CASES` counts
requests x budgets x drafters x temperatures as they ran; the summary test prints it.

Also: one target forward and one drafter forward per round whatever the batch size; the batch
really fills (stats); results do not depend on max_batch or on arrival order; the thread
scheduler admits requests arriving while others run; a request whose on_chunk raises, or that is
cancelled, leaves without disturbing the others.
"""

from __future__ import annotations

import time

import pytest

from ddtree_bench.engine import batch as batch_mod
from ddtree_bench.engine.batch import BatchRequest
from ddtree_bench.engine.batch_scheduler import BatchScheduler
from ddtree_bench.engine.generate import Engine
from batch_support import (N_REQ, alone, assert_lengths_and_stops, assert_same, count_forwards, make_requests,
                           one_fails_one_cancelled, plain_batch, requests_with_stops, rigged_alone, rigged_plain)
from engine_support import one_torch_thread  # noqa: F401 (fixture)

METHODS = [("ar", 0), ("dflash", 0), ("ddtree", 1), ("ddtree", 16), ("ddtree", 48)]
SPEC = [m for m in METHODS if m[0] != "ar"]
IDS, SPEC_IDS = ([f"{m}{b or ''}" for m, b in ms] for ms in (METHODS, SPEC))
TEMPS = (0.0, 0.8)
MAX_BATCH = 3
CASES: dict[str, int] = {}  # drafter -> request runs compared (requests x budgets x temperatures)


def _count(drafter: str, n: int) -> None:
    CASES[drafter] = CASES.get(drafter, 0) + n


def check_batch(engine: Engine, drafter_name: str, method: str, budget: int, reqs: list[BatchRequest], max_batch: int = MAX_BATCH):
    got, loop = plain_batch(engine, method, budget, max_batch, reqs)
    for i, (r, g) in enumerate(zip(reqs, got)):
        assert_same(g, alone(engine, method, budget, r), (drafter_name, method, budget, r.temperature, i))
    assert loop.stats.max_batch_size == max_batch  # the batch really filled
    _count(drafter_name, len(reqs))
    return got, loop


@pytest.mark.parametrize("T", TEMPS, ids=["T0", "T0.8"])
@pytest.mark.parametrize("method,budget", METHODS, ids=IDS)
def test_random_drafter_batch_equals_batch1(rnd, method, budget, T):
    got, _ = check_batch(rnd, "random", method, budget, requests_with_stops(rnd, T, seed=1))
    assert_lengths_and_stops(got, T)


@pytest.mark.parametrize("T", TEMPS, ids=["T0", "T0.8"])
@pytest.mark.parametrize("method,budget", SPEC, ids=SPEC_IDS)
def test_trained_toy_drafter_batch_equals_batch1(toy, method, budget, T):
    reqs = make_requests(toy.target.cfg.vocab_size, T, seed=2, text=True)  # byte-tokenizer ids of text prompts
    got, _ = check_batch(toy, "toy", method, budget, reqs)
    if T == 0.0:  # a drafter that accepts, so deep paths ran
        assert max(a for g in got for a in g.accept_lengths) >= min(4, budget + 1 if method == "ddtree" else 16)


@pytest.mark.parametrize("method,budget", SPEC, ids=SPEC_IDS)
def test_rigged_drafter_batch_equals_batch1_with_deep_paths_and_compaction(rnd, method, budget):
    reqs = make_requests(64, 0.0, seed=3)
    got, loop, keyed = rigged_plain(rnd, method, budget, MAX_BATCH, reqs)
    assert keyed.batched_calls == loop.stats.rounds  # one batched proposal per round
    non_prefix = 0
    for r, g in zip(reqs, got):
        assert_same(g, rigged_alone(rnd, method, budget, r), ("rigged", method, budget, r.key))
        non_prefix += sum(t.accepted != list(range(len(t.accepted))) for t in g.trees)
    assert max(a for g in got for a in g.accept_lengths) >= (2 if budget == 1 else 8)
    if method == "ddtree" and budget > 1:
        assert non_prefix > 0  # a sibling path was accepted: KV compaction inside one request's region
    _count("rigged", len(reqs))


def test_one_target_and_one_drafter_forward_per_round(rnd, monkeypatch):
    calls = count_forwards(monkeypatch, batch_mod, "target_forward_batch", "drafter_forward_batch")
    loop = rnd.batch_loop("ddtree", 16, 4)
    loop.run(make_requests(64, 0.0, seed=4))
    assert loop.stats.rounds > 0 and calls == {"target": loop.stats.rounds, "drafter": loop.stats.rounds}
    assert loop.stats.mean_batch_size > 1.5


def test_results_do_not_depend_on_max_batch_or_order(rnd):
    reqs = make_requests(64, 0.8, seed=5)
    base = rnd.batch_loop("ddtree", 16, 1).run(reqs)
    for mb in (2, N_REQ):
        got = rnd.batch_loop("ddtree", 16, mb).run(reqs)
        assert [g.output_ids for g in got] == [g.output_ids for g in base]
    rev = rnd.batch_loop("ddtree", 16, 3).run(reqs[::-1])[::-1]
    assert [g.output_ids for g in rev] == [g.output_ids for g in base]
    assert [g.accept_lengths for g in rev] == [g.accept_lengths for g in base]
    _count("random", 3 * len(reqs))


def test_scheduler_admits_requests_arriving_mid_flight(rnd):
    reqs = make_requests(64, 0.8, seed=6)
    sched = BatchScheduler(rnd.batch_loop("dflash", 0, 3))
    seen_active = []
    try:
        futs = []
        for r in reqs:
            futs.append(sched.submit(r))
            time.sleep(0.02)  # later requests arrive while earlier ones are in flight
            seen_active.append(len(sched.loop.active))
        got = [f.result(timeout=120) for f in futs]
    finally:
        sched.close()
    for r, g in zip(reqs, got):
        assert_same(g, alone(rnd, "dflash", 0, r), ("scheduler", r.key))
    assert sched.stats.max_batch_size >= 2
    assert sched.stats.admitted == len(reqs)
    _count("random", len(reqs))


def test_a_failing_or_cancelled_request_leaves_alone(rnd):
    sched = one_fails_one_cancelled(rnd, rnd.batch_loop("ddtree", 16, N_REQ), make_requests(64, 0.0, seed=7))
    with pytest.raises(ValueError):
        sched.loop.check(BatchRequest([], 4))


def test_zz_case_count(capsys):
    """Prints how many request runs were compared with batch 1, per drafter (the test order puts it last)."""
    total = sum(CASES.values())
    with capsys.disabled():
        print(f"\nbatched == batch-1 request comparisons: {CASES} (total {total})")
    assert total > 0
