"""The batched fast loop (gpu/batch_loop.BatchFastLoop) equals batch 1 and the batched plain loop.

It runs here on a CPU (eager, the same fixed-shape code the GPU captures). For each drafter (the
seeded random DFlash drafter, a proposer rigged per request to draft its own greedy continuation
with controlled errors, the bundled trained toy drafter) and method (AR, DFlash, DDTree at budgets
1 and 16), five requests with mixed prompt lengths, stop ids, max_new_tokens (one needs no round),
temperatures (0 and 0.8, one request greedy, one with top_p 0.9) and seeds run through three slots,
so requests are admitted mid-flight and live requests move down to lower slots; with four slots the
bucket of 4 runs with padding slots. Every request's output, finish reason, per-round acceptance
lengths and accepted tree nodes must equal its batch-1 run (`Engine.generate`, the plain loop) in
fp32, and the whole batch must equal `BatchLoop` (the batched plain loop, its twin) token for token.
The rigged proposer runs at T = 0 only (it checks every bonus against the greedy truth). The
requests, engines, batch-1 runs and BatchLoop runs come from tests/batch_support.py (each computed
once per session, shared with tests/engine/test_batch.py, which checks BatchLoop against batch 1).

Equality comparisons as they ran (requests x budgets x drafters x temperatures; `CASES`, printed
by the last test): random drafter 5 requests x 7 (method/budget, T) points (AR, DFlash, DDTree 16 at
T = 0 and 0.8, DDTree 1 at T = 0) = 35; toy drafter 5 x 3 (DFlash T 0, DDTree 16 at T 0 and 0.8) = 15;
rigged 5 x 2 (DFlash, DDTree 16) x T 0 = 10, AR with two rounds in flight 4 x 2 T = 8, AR with requests
waiting 5 - those 73 against batch 1 AND BatchLoop (batch sizes included); plus padding buckets 5, cache growth
4, logit gaps 5, thread scheduler 5 x 2 (AR, DDTree 16), a drafter variant 5, AR alone with its next round queued
early 5 x 2 T against batch 1: 112 request runs, all equal (and 3 survivors of a failing/cancelled batch), and 25 flagged-round runs.
"""

from __future__ import annotations

import time

import pytest
import torch
from batch_support import (
    FlakySlotted,
    KeyedRigged,
    alone,
    assert_lengths_and_stops,
    assert_same,
    count_forwards,
    make_requests,
    one_fails_one_cancelled,
    plain_batch,
    requests_with_stops,
    rigged_alone,
    rigged_plain,
)
from engine_support import one_torch_thread  # noqa: F401 (fixture)

from ddtree_bench.engine.batch import BatchLoop, BatchRequest
from ddtree_bench.engine.batch_scheduler import BatchScheduler
from ddtree_bench.engine.generate import Engine
from ddtree_bench.engine.gpu import batch_loop as bl
from ddtree_bench.engine.gpu import builders
from ddtree_bench.engine.gpu.batch_loop import BatchFastLoop, buckets_for

RANDOM_CASES = [(m, b, T) for m, b in (("ar", 0), ("dflash", 0), ("ddtree", 1), ("ddtree", 16)) for T in (0.0, 0.8)
                if (m, b, T) != ("ddtree", 1, 0.8)]
RANDOM_IDS = [f"{m}{b or ''}-T{T:g}" for m, b, T in RANDOM_CASES]
SLOTS = 3
CASES: dict[str, int] = {}


def _count(what: str, n: int) -> None:
    CASES[what] = CASES.get(what, 0) + n


def check(engine: Engine, what: str, method: str, budget: int, reqs: list[BatchRequest], slots: int = SLOTS,
          twin: bool = True):
    loop = BatchFastLoop(engine.target, engine.proposer, method, budget, slots)
    got = loop.run(reqs)
    plain = plain_batch(engine, method, budget, slots, reqs)[0] if twin else [None] * len(reqs)
    for i, (r, g, p) in enumerate(zip(reqs, got, plain)):
        key = (what, method, budget, r.temperature, i)
        assert_same(g, alone(engine, method, budget, r), key)
        if p is not None:
            assert_same(g, p, key)
        assert g.batch_sizes == (p.batch_sizes if p is not None else g.batch_sizes)
    assert loop.stats.max_batch_size == slots   # the batch really filled
    _count(what, len(reqs))
    return got, loop


def test_buckets_are_powers_of_two_then_max_batch():
    assert buckets_for(1) == (1,)
    assert buckets_for(8) == (1, 2, 4, 8)
    assert buckets_for(6) == (1, 2, 4, 6)
    assert buckets_for(16) == (1, 2, 4, 8, 16)


@pytest.mark.parametrize("method,budget,T", RANDOM_CASES, ids=RANDOM_IDS)
def test_random_drafter_equals_batch1_and_batchloop(rnd, method, budget, T):
    got, loop = check(rnd, "random", method, budget, requests_with_stops(rnd, T, seed=1))
    assert_lengths_and_stops(got, T)
    assert {r["bucket"] for r in loop.rounds} >= {1, 3}   # the batch shrank as requests retired


@pytest.mark.parametrize("method,budget,T", [("dflash", 0, 0.0), ("ddtree", 16, 0.0), ("ddtree", 16, 0.8)],
                         ids=["dflash-T0", "ddtree16-T0", "ddtree16-T0.8"])
def test_trained_toy_drafter_equals_batch1_and_batchloop(toy, method, budget, T):
    reqs = make_requests(toy.target.cfg.vocab_size, T, seed=2, text=True)
    got, _ = check(toy, "toy", method, budget, reqs)
    if T == 0.0:   # a drafter that accepts: deep paths ran
        assert max(a for g in got for a in g.accept_lengths) >= min(4, budget + 1 if method == "ddtree" else 16)


@pytest.mark.parametrize("method,budget", [("dflash", 0), ("ddtree", 16)], ids=["dflash", "ddtree16"])
def test_rigged_drafter_deep_paths_compaction_and_context(rnd, method, budget):
    reqs = make_requests(64, 0.0, seed=3)
    keyed = KeyedRigged(rnd, reqs)
    loop = BatchFastLoop(rnd.target, keyed, method, budget, SLOTS)
    got = loop.run(reqs)
    assert keyed.batched_calls == loop.stats.rounds
    twin = rigged_plain(rnd, method, budget, SLOTS, reqs)[0]
    non_prefix = 0
    for r, g, p in zip(reqs, got, twin):
        assert_same(g, rigged_alone(rnd, method, budget, r), ("rigged", method, budget, r.key))
        assert_same(g, p, ("rigged twin", method, budget, r.key))
        non_prefix += sum(t.accepted != list(range(len(t.accepted))) for t in g.trees)
    assert max(a for g in got for a in g.accept_lengths) >= (2 if budget == 1 else 8)
    if method == "ddtree" and budget > 1:
        assert non_prefix > 0   # a sibling path was accepted: KV compaction inside one slot's region
    _count("rigged", len(reqs))


def test_padding_slots_emit_nothing_and_disturb_nothing(rnd):
    """Four slots, five requests: the bucket of 4 runs with 3 live requests (a padding slot)."""
    reqs = make_requests(64, 0.8, seed=4)
    got, loop = check(rnd, "padding", "ddtree", 16, reqs, slots=4, twin=False)
    assert any(r["bucket"] == 4 and r["batch"] == 3 for r in loop.rounds)
    assert set(loop.cold_s) == {r["bucket"] for r in loop.rounds} and min(loop.cold_s.values()) > 0   # each bucket's first round
    assert int(loop.live.sum()) == 0 and int(loop.start.sum()) == 0   # every slot idle at the end


def test_cache_grows_mid_flight_and_keeps_the_live_regions(rnd):
    """Short requests first, then a long one admitted while two of them run: the slotted caches grow
    (graphs dropped) and the requests in flight go on from their copied regions."""
    reqs = make_requests(64, 0.0, seed=5, lens=(3, 4, 5, 90), news=(6, 30, 30, 40))[:4]
    loop = BatchFastLoop(rnd.target, rnd.proposer, "dflash", 0, 3)
    for r in reqs[:3]:
        assert loop.admit(r) is None
    done = {}
    while not done:
        done.update({d.request.key: d for d in loop.step()})
    cap0 = loop.capacity
    assert loop.admit(reqs[3]) is None
    assert loop.capacity > cap0 and len(loop.active) == 3
    while loop.active:
        done.update({d.request.key: d for d in loop.step()})
    for r in reqs:
        assert_same(done[r.key].generation, alone(rnd, "dflash", 0, r), ("growth", r.key))
    _count("growth", len(reqs))


def test_one_target_and_one_drafter_forward_per_round(rnd, monkeypatch):
    """A round over two or more slots: ONE batched target forward and ONE batched draft, queued by the round before
    where that round ran the same bucket - plus, wasted, the draft queued ahead of a round that turned out to run
    another bucket (or an admission came first, or none followed): at most one per bucket change or request. A
    round of one request: batch 1's forwards (loop.FastLoop's stages on slot 0), one target forward, and one draft
    - at most one more per request, a draft queued ahead of a round that turned out to be its last."""
    from ddtree_bench.engine.gpu import loop as single

    calls = count_forwards(monkeypatch, bl, "target_forward_batch", "draft_forward_batch")
    solo = count_forwards(monkeypatch, single, "target_forward", "draft_forward")
    loop = BatchFastLoop(rnd.target, rnd.proposer, "ddtree", 16, 4)
    reqs = make_requests(64, 0.0, seed=6)
    loop.run(reqs)
    batched = sum(r["bucket"] > 1 for r in loop.rounds)
    ones = sum(r["bucket"] == 1 for r in loop.rounds)
    assert batched > 0 and ones > 0 and batched + ones == loop.stats.rounds
    changes = sum(a["bucket"] > 1 and a["bucket"] != b["bucket"] for a, b in zip(loop.rounds, loop.rounds[1:])) + 1
    assert calls["target"] == batched and batched < calls["drafter"] <= batched + changes + len(reqs)
    assert solo["target"] == ones and ones <= solo["drafter"] <= ones + len(reqs)
    assert loop.stats.mean_batch_size > 1.5


def test_logit_gaps_and_stage_times(rnd):
    reqs = make_requests(64, 0.8, seed=7, gaps=True)
    got, loop = check(rnd, "gaps", "ddtree", 16, reqs, twin=False)
    for r, g in zip(reqs, got):
        ref = alone(rnd, "ddtree", 16, r)
        assert g.logit_gaps == pytest.approx(ref.logit_gaps, rel=1e-4, abs=1e-4)
        assert set(g.stage_ns) == {"prefill", "draft", "tree_build", "verify", "commit"}
        assert g.stage_ns["prefill"] > 0 and (g.stage_ns["verify"] > 0) == bool(g.accept_lengths)
    assert all(r["verify"] > 0 and r["draft"] > 0 for r in loop.rounds)


@pytest.mark.parametrize("T", [0.0, 0.8], ids=["T0", "T0.8"])
def test_ar_reads_each_round_with_the_next_one_queued(rnd, monkeypatch, T):
    """AR pipelined (BatchFastLoop._ar_step): with four requests admitted at once (none waits), the host reads every
    round with the next one already queued - two target forwards in flight at each read - while two or more requests
    are active, and one round at a time once one is left (as the single loop: nothing queued ahead of its stop
    token). Requests that stop on a stop id while the next round is queued (their rows in it computed for nothing) or
    at max_new_tokens (no round queued past it) leave the others equal to batch 1 and to BatchLoop, batch sizes
    included; no round runs that is never read."""
    from ddtree_bench.engine.gpu import loop as single
    from ddtree_bench.engine.gpu.loop import Ticket

    calls = count_forwards(monkeypatch, bl, "target_forward_batch", "draft_forward_batch")
    solo = count_forwards(monkeypatch, single, "target_forward", "draft_forward")
    queued_at_read: list[int] = []
    active_at_step: list[int] = []
    take, ar_step = Ticket.take, BatchFastLoop._ar_step

    def counted(ticket):
        queued_at_read.append(calls["target"] + solo["target"])
        return take(ticket)

    def step(loop, waiting):
        active_at_step.append(len(loop.active))
        return ar_step(loop, waiting)

    monkeypatch.setattr(Ticket, "take", counted)
    monkeypatch.setattr(BatchFastLoop, "_ar_step", step)
    reqs = requests_with_stops(rnd, T, seed=1)[:4]
    got, loop = check(rnd, "ar-pipelined", "ar", 0, reqs, slots=4)
    assert_lengths_and_stops(got, T)
    read = len(loop.rounds)
    assert read == len(queued_at_read) == len(active_at_step) == loop.stats.rounds
    in_flight = [q - j for j, q in enumerate(queued_at_read)]   # forwards queued, less rounds read before this one
    alone = [n == 1 for n in active_at_step]
    assert 0 < alone.index(True) and all(alone[alone.index(True):])   # requests retire until one is left
    assert all(f == 1 for f, one in zip(in_flight, alone) if one)
    assert in_flight[: alone.index(True)] == [2] * alone.index(True)   # (from the first read on, while two or more)
    assert calls["target"] + solo["target"] == read   # no round ran for nothing: the last request ran alone
    assert solo["target"] > 0 and calls["target"] > 0
    assert {r["bucket"] for r in loop.rounds} >= {1, 4}


@pytest.mark.parametrize("T", [0.0, 0.8], ids=["T0", "T0.8"])
def test_ar_alone_queues_the_next_round_before_its_token_goes_out(rnd, monkeypatch, T):
    """One request alone (no other active, none waiting): once a round is read, the round after it is queued before
    that round's token is emitted - the single loop's order (FastLoop.generate), so the GPU computes while the host
    hands tokens out - except after its last round (a stop id or max_new_tokens): no round runs that is never read.
    Such a round is timed from the last mark of the round before it (Laps.begin: one mark fewer a round, as the
    single loop times its rounds), so only the first round makes a "begin" mark and every round still has its
    stages. Each request of requests_with_stops runs alone through two slots (one stops inside on a greedy stop id,
    one runs to max_new_tokens, one needs no round) and equals batch 1 and BatchLoop."""
    from ddtree_bench.engine.batch import _Active
    from ddtree_bench.engine.gpu import loop as single
    from ddtree_bench.engine.gpu.loop import Laps, Ticket

    calls = count_forwards(monkeypatch, bl, "target_forward_batch", "draft_forward_batch")
    solo = count_forwards(monkeypatch, single, "target_forward", "draft_forward")
    reads, ahead_at_emit = [0], []
    take, emit = Ticket.take, _Active.emit

    def counted(ticket):
        reads[0] += 1
        return take(ticket)

    def spy(st, tokens, now):   # rounds queued and not yet read when a token goes out
        ahead_at_emit.append(calls["target"] + solo["target"] - reads[0])
        return emit(st, tokens, now)

    begins, mark = [0], Laps.mark

    def counted_mark(laps, name):
        begins[0] += name == "begin"
        return mark(laps, name)

    monkeypatch.setattr(Ticket, "take", counted)
    monkeypatch.setattr(_Active, "emit", spy)
    monkeypatch.setattr(Laps, "mark", counted_mark)
    reasons = set()
    for r in requests_with_stops(rnd, T, seed=1):
        ahead_at_emit.clear()
        begins[0] = 0
        queued0, read0 = calls["target"] + solo["target"], reads[0]
        loop = BatchFastLoop(rnd.target, None, "ar", 0, 2)
        (g,) = loop.run([r])
        assert_same(g, alone(rnd, "ar", 0, r), ("ar-alone", T))
        rounds = len(loop.rounds)
        assert calls["target"] + solo["target"] - queued0 == reads[0] - read0 == rounds   # none queued past the last
        assert ahead_at_emit == [0] + ([1] * (rounds - 1) + [0] if rounds else []), (rounds, ahead_at_emit)
        assert begins[0] == min(rounds, 1) and all({"verify", "commit"} <= set(x) for x in loop.rounds)
        reasons.add(g.finish_reason)
        _count("ar-alone", 1)
    assert "length" in reasons and (T > 0 or "stop" in reasons)


@pytest.mark.parametrize("method,budget", [("ar", 0), ("ddtree", 16)])
def test_stage_marks_are_read_after_the_last_token_and_add_up(rnd, monkeypatch, method, budget):
    """A round's stage marks are not read between its result and the next round's queueing (BatchFastLoop._settle):
    one request alone has every mark read after its last token went out (as FastLoop reads them after the
    generation), and no mark is read twice. With SETTLE_ROUNDS = 2 several requests run with at most two rounds'
    marks unread, and each request's stage_ns (less prefill) is the sum of the rounds it took part in, `rounds` one
    entry per round; outputs equal batch 1 either way."""
    from ddtree_bench.engine.batch import _Active
    from ddtree_bench.engine.gpu.loop import Laps

    emitted, read_at = [0], []
    emit, read = _Active.emit, Laps.rounds

    def spy_emit(st, tokens, now):
        emitted[0] += 1
        return emit(st, tokens, now)

    def spy_read(laps):
        read_at.append(emitted[0])
        return read(laps)

    monkeypatch.setattr(_Active, "emit", spy_emit)
    monkeypatch.setattr(Laps, "rounds", spy_read)
    proposer = rnd.proposer if method != "ar" else None
    r = make_requests(64, 0.0, seed=3)[0]
    loop = BatchFastLoop(rnd.target, proposer, method, budget, 2)
    (g,) = loop.run([r])
    assert_same(g, alone(rnd, method, budget, r), ("marks-alone", method))
    assert len(g.accept_lengths) > 2 and read_at == [emitted[0]] * len(g.accept_lengths)   # once each, at the end
    assert len(loop.rounds) == len(g.accept_lengths)

    monkeypatch.setattr(bl, "SETTLE_ROUNDS", 2)
    held = []
    settle = BatchFastLoop._settle

    def spy_settle(lp):
        held.append(len(lp._untimed))
        return settle(lp)

    monkeypatch.setattr(BatchFastLoop, "_settle", spy_settle)
    reqs = make_requests(64, 0.0, seed=5)
    loop = BatchFastLoop(rnd.target, proposer, method, budget, 2)
    got = loop.run(reqs)
    for q, g in zip(reqs, got):
        assert_same(g, alone(rnd, method, budget, q), ("marks-settle", method))
    assert held and max(held) <= 2
    rounds = loop.rounds
    assert len(rounds) == loop.stats.rounds
    total = {k: sum(int(x.get(k, 0.0) * 1e6) for x in rounds) for k in ("verify", "commit")}
    assert total["verify"] > 0
    # every round counts once per request in it: the requests' verify ns sum to the rounds' weighted by batch size
    weighted = sum(int(x["verify"] * 1e6) * x["batch"] for x in rounds)
    assert sum(g.stage_ns["verify"] for g in got) == pytest.approx(weighted, abs=len(rounds) * len(reqs))
    _count("marks", 1 + len(reqs))


def test_ar_with_requests_waiting_queues_nothing_ahead(rnd, monkeypatch):
    """While requests wait for a slot (BatchLoop.run's `waiting`), AR reads each round before queuing the next, so
    a request admitted into a freed slot joins the very next round, as in BatchLoop (check: batch sizes equal)."""
    reqs = requests_with_stops(rnd, 0.0, seed=11)
    waits: list[bool] = []
    step = BatchFastLoop.step

    def spy(loop, waiting=False):
        waits.append(waiting)
        return step(loop, waiting)

    monkeypatch.setattr(BatchFastLoop, "step", spy)
    check(rnd, "ar-waiting", "ar", 0, reqs, slots=2)
    assert True in waits and False in waits


@pytest.mark.parametrize("method,budget", [("ar", 0), ("ddtree", 16)], ids=["ar", "ddtree16"])
def test_scheduler_runs_the_fast_loop_with_mid_flight_arrivals(rnd, method, budget):
    """Requests arrive while rounds run (AR: while the next one is queued, so they join the one after)."""
    reqs = make_requests(64, 0.8, seed=8)
    modes = set()   # the engine thread runs in inference mode (entered once for the thread, not by every step)
    for r in reqs:
        r.on_chunk = lambda toks: modes.add(torch.is_inference_mode_enabled())
    sched = BatchScheduler(BatchFastLoop(rnd.target, rnd.proposer if method != "ar" else None, method, budget, 3))
    try:
        futs = []
        for r in reqs:
            futs.append(sched.submit(r))
            time.sleep(0.02)
        got = [f.result(timeout=120) for f in futs]
    finally:
        sched.close()
    for r, g in zip(reqs, got):
        assert_same(g, alone(rnd, method, budget, r), ("scheduler", method, r.key))
    assert sched.stats.max_batch_size >= 2 and sched.stats.admitted == len(reqs) and modes == {True}
    _count("scheduler", len(reqs))


def test_marks_that_cannot_be_read_fail_their_requests_once_not_every_later_one(rnd, monkeypatch):
    """A round whose stage marks raise when read (a broken event) fails the requests retiring then, through the
    scheduler, and is dropped: the next request is served and equals batch 1 (the marks are not read again at every
    later retirement, which would wedge the server)."""
    from ddtree_bench.engine.gpu.loop import Laps

    read, bad = Laps.rounds, []

    def broken(laps):
        if not bad:
            bad.append(laps)
        if laps is bad[0]:
            raise RuntimeError("unreadable marks")
        return read(laps)

    monkeypatch.setattr(Laps, "rounds", broken)
    r1, r2 = make_requests(64, 0.0, seed=11)[:2]
    sched = BatchScheduler(BatchFastLoop(rnd.target, None, "ar", 0, 2))
    try:
        with pytest.raises(RuntimeError, match="unreadable marks"):
            sched.submit(r1).result(timeout=120)
        g = sched.submit(r2).result(timeout=120)
    finally:
        sched.close()
    assert_same(g, alone(rnd, "ar", 0, r2), ("marks-broken", r2.key))
    assert g.stage_ns["verify"] > 0


def test_engine_batch_loop_picks_the_fast_loop_for_cuda_graph_engines(rnd):
    fast = Engine(rnd.target, rnd.drafter, cuda_graphs=True)
    assert isinstance(fast.batch_loop("ddtree", 16, 4), BatchFastLoop)
    assert isinstance(rnd.batch_loop("ddtree", 16, 4), BatchLoop)
    assert isinstance(fast.batch_loop("ddtree", 0, 4), BatchLoop)   # budget 0: the plain loop handles it


def test_a_failing_request_leaves_alone(rnd):
    one_fails_one_cancelled(rnd, BatchFastLoop(rnd.target, rnd.proposer, "ddtree", 16, 5), make_requests(64, 0.0, seed=9))


def test_a_drafter_variant_drafts_through_its_own_proposer(rnd):
    """A VariantProposer (explain's drafter variants) is not the plain DFlash drafter: the loop calls its
    propose() per slot, so the batch equals the variant's own batch-1 runs."""
    from ddtree_bench.engine.draft_variants import VariantProposer, parse_variant

    prop = VariantProposer(rnd.drafter, rnd.target, parse_variant("causal"))
    loop = BatchFastLoop(rnd.target, prop, "ddtree", 16, SLOTS)
    assert loop.drafter is None
    reqs = make_requests(64, 0.0, seed=10)
    got = loop.run(reqs)
    one = Engine(rnd.target, proposer=prop)
    for r, g in zip(reqs, got):
        assert_same(g, alone(one, "ddtree", 16, r), ("variant", r.key))
    _count("variant", len(reqs))


def _flaky(monkeypatch, flagged: set[int]) -> list[FlakySlotted]:
    made: list[FlakySlotted] = []

    def checked(L, V, budget, slots, device, dtype, exact=None, kernel="block"):
        made.append(FlakySlotted(exact, flagged))
        return made[-1]

    monkeypatch.setattr(builders, "checked_slotted", checked)
    return made


@pytest.mark.parametrize("T", [0.0, 0.8], ids=["T0", "T0.8"])
@pytest.mark.parametrize("flagged", [{1, 2, 3}, {2, 4, 5, 7}], ids=["first-three", "mixed"])
def test_a_flagged_batched_round_is_redone_exactly_and_draws_the_same(rnd, monkeypatch, T, flagged):
    """Batched rounds built by a slotted builder that raises its certificate flag (consecutive flags, the first
    round): the guarded commit must leave every slot's state as it was, the round is redone with the exact batched
    builder, and every request - sampled ones too: their generators go back to the state of the discarded draw -
    still equals batch 1 and BatchLoop token for token."""
    made = _flaky(monkeypatch, flagged)
    got, loop = check(rnd, "flagged", "ddtree", 16, requests_with_stops(rnd, T, seed=12))
    assert loop.tree_builder == "flaky-slotted" and len(made) == 1
    assert made[0].calls >= max(flagged) and loop._redone == len(flagged) == loop.redone_rounds
    assert all(bk.fallback is not None and bk.layout.guard for bk in loop._stages.values())


def test_flagged_rounds_with_a_host_side_proposer(rnd, monkeypatch):
    """A host-side proposer (no solo loop: every bucket runs the batched stages, the slotted builder and its redo);
    the rigged drafts accept deep paths, so a wrongly committed flagged round would change the tokens."""
    made = _flaky(monkeypatch, {1, 3, 4})
    reqs = make_requests(64, 0.0, seed=3)
    loop = BatchFastLoop(rnd.target, KeyedRigged(rnd, reqs), "ddtree", 16, SLOTS)
    got = loop.run(reqs)
    for r, g in zip(reqs, got):
        assert_same(g, rigged_alone(rnd, "ddtree", 16, r), ("rigged flagged", r.key))
    assert made[0].calls > 4 and loop.redone_rounds == 3
    assert max(a for g in got for a in g.accept_lengths) >= 8
    _count("flagged", len(reqs))


def test_the_batched_builder_rule(rnd, monkeypatch):
    """Where the slotted builder's check fails (None: as on this CPU), or the rule names torch, batched rounds use the
    exact batched builder, unguarded; tree_kernel is checked."""
    loop = BatchFastLoop(rnd.target, rnd.proposer, "ddtree", 16, SLOTS)
    loop.run(make_requests(64, 0.0, seed=13))
    assert loop.tree_builder == "torch-batched" and loop.redone_rounds == 0
    assert all(bk.fallback is None and not bk.layout.guard for bk in loop._stages.values())
    made = _flaky(monkeypatch, set())
    loop = BatchFastLoop(rnd.target, rnd.proposer, "ddtree", 16, SLOTS, tree_kernel="torch")
    loop.run(make_requests(64, 0.0, seed=13))
    assert loop.tree_builder == "torch-batched" and made == []
    with pytest.raises(ValueError, match="tree kernel"):
        BatchFastLoop(rnd.target, rnd.proposer, "ddtree", 16, SLOTS, tree_kernel="heap")


def test_zz_case_count(capsys):
    """Prints how many request runs were compared with batch 1 (the test order puts it last)."""
    total = sum(CASES.values())
    with capsys.disabled():
        print(f"\nbatched fast loop == batch-1 request comparisons: {CASES} (total {total})")
    assert total > 0
