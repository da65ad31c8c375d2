"""The batched plain loop is lossless: every request batched equals its batch-1 run token for token.

For each drafter (the seeded random DFlash drafter, a proposer rigged to draft each request's own
greedy continuation with controlled errors, the bundled trained toy drafter) and each method
(AR, DFlash, DDTree at several budgets), a batch of requests with mixed prompt lengths, stop ids,
max_new_tokens, temperatures (0 and > 0, one with top_p < 1) and seeds runs through
`BatchLoop` with fewer slots than requests (so requests are admitted mid-flight as others
retire); each request's output, finish reason and per-round acceptance lengths must equal what
`Engine.generate` (batch 1, `PlainLoop`) gives for it alone, in fp32. The rigged proposer runs at
T = 0 only (it checks the bonus against the greedy truth). `CASES` counts
requests x budgets x drafters x temperatures as they ran; the summary test prints it.

Also: one target forward and one drafter forward per round whatever the batch size; the batch
really fills (stats); results do not depend on max_batch or on arrival order; the thread
scheduler admits requests arriving while others run; a request whose on_chunk raises, or that is
cancelled, leaves without disturbing the others.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from ddtree_bench.engine import batch as batch_mod
from ddtree_bench.engine.batch import BatchLoop, BatchRequest, Cancelled
from ddtree_bench.engine.batch_scheduler import BatchScheduler
from ddtree_bench.engine.generate import Engine
from ddtree_bench.engine.loading import load_drafter, load_target, random_pair
from ddtree_bench.pair import TOY_DIR
from engine_support import RiggedProposer, greedy_reference, one_torch_thread  # noqa: F401 (fixture)

METHODS = [("ar", 0), ("dflash", 0), ("ddtree", 1), ("ddtree", 16), ("ddtree", 48)]
SPEC = [m for m in METHODS if m[0] != "ar"]
IDS, SPEC_IDS = ([f"{m}{b or ''}" for m, b in ms] for ms in (METHODS, SPEC))
TEMPS = (0.0, 0.8)
N_REQ = 5
MAX_BATCH = 3
CASES: dict[str, int] = {}  # drafter -> request runs compared (requests x budgets x temperatures)


def _count(drafter: str, n: int) -> None:
    CASES[drafter] = CASES.get(drafter, 0) + n


TEXTS = ("Q: 2+3? A:", "The cat sat on the", "Once upon a time, in a small", "x", "Hello, my name is", "def add(a, b):")


def make_requests(vocab: int, T: float, seed: int, stops: dict[int, int] | None = None, text: bool = False) -> list[BatchRequest]:
    g = torch.Generator().manual_seed(seed)
    lens = (3, 11, 6, 17, 8, 4)[:N_REQ]
    news = (23, 9, 31, 17, 1, 12)[:N_REQ]  # one request needs no round at all (max_new_tokens = 1)
    out = []
    for i, (n, m) in enumerate(zip(lens, news)):
        prompt = list(TEXTS[i].encode()) if text else torch.randint(0, vocab - 2, (n,), generator=g).tolist()
        out.append(BatchRequest(prompt, max_new_tokens=m, temperature=T if i != 1 else 0.0, seed=1000 + i if i != 3 else None,
                                top_p=0.9 if i == 2 else 1.0, stop_ids=[stops[i]] if stops and i in stops else (),
                                record_trees=True, key=i))
    return out


def alone(engine: Engine, method: str, budget: int, r: BatchRequest):
    return engine.generate(r.prompt_ids, method, budget, r.max_new_tokens, r.temperature, r.top_p, r.seed, r.stop_ids,
                           record_trees=True)


def assert_same(got, ref, what) -> None:
    assert got.output_ids == ref.output_ids, what
    assert got.accept_lengths == ref.accept_lengths, what
    assert got.finish_reason == ref.finish_reason, what
    if ref.trees is not None:
        assert [t.accepted for t in got.trees] == [t.accepted for t in ref.trees], what


def stops_from(engine: Engine, reqs: list[BatchRequest]) -> dict[int, int]:
    """A stop id for requests 0 and 2: a token their greedy AR output produces mid-way (so the stop
    really ends them inside a round)."""
    out = {}
    for i in (0, 2):
        r = reqs[i]
        toks = engine.generate(r.prompt_ids, "ar", 0, r.max_new_tokens).output_ids
        k = next((j for j in range(3, len(toks)) if toks[j] not in toks[:j]), None)
        if k is not None:
            out[i] = toks[k]
    return out


def check_batch(engine: Engine, drafter_name: str, method: str, budget: int, reqs: list[BatchRequest], max_batch: int = MAX_BATCH):
    loop = engine.batch_loop(method, budget, max_batch)
    got = loop.run(reqs)
    for i, (r, g) in enumerate(zip(reqs, got)):
        assert_same(g, alone(engine, method, budget, r), (drafter_name, method, budget, r.temperature, i))
    assert loop.stats.max_batch_size == max_batch  # the batch really filled
    _count(drafter_name, len(reqs))
    return got, loop


@pytest.fixture(scope="module")
def rnd():
    target, drafter = random_pair(seed=0)
    return Engine(target, drafter)


@pytest.fixture(scope="module")
def toy():
    target = load_target(TOY_DIR / "target", "float32", "cpu")
    drafter = load_drafter(TOY_DIR / "draft", target.cfg, "float32", "cpu")
    return Engine(target, drafter)


@pytest.mark.parametrize("T", TEMPS, ids=["T0", "T0.8"])
@pytest.mark.parametrize("method,budget", METHODS, ids=IDS)
def test_random_drafter_batch_equals_batch1(rnd, method, budget, T):
    reqs = make_requests(64, T, seed=1)
    reqs = make_requests(64, T, seed=1, stops=stops_from(rnd, reqs))
    got, _ = check_batch(rnd, "random", method, budget, reqs)
    assert any(g.finish_reason == "length" for g in got)
    if T == 0.0:  # the greedy stop ids do end requests inside a round
        assert any(g.finish_reason == "stop" for g in got)


@pytest.mark.parametrize("T", TEMPS, ids=["T0", "T0.8"])
@pytest.mark.parametrize("method,budget", SPEC, ids=SPEC_IDS)
def test_trained_toy_drafter_batch_equals_batch1(toy, method, budget, T):
    reqs = make_requests(toy.target.cfg.vocab_size, T, seed=2, text=True)  # byte-tokenizer ids of text prompts
    got, _ = check_batch(toy, "toy", method, budget, reqs)
    if T == 0.0:  # a drafter that accepts, so deep paths ran
        assert max(a for g in got for a in g.accept_lengths) >= min(4, budget + 1 if method == "ddtree" else 16)


class KeyedRigged:
    """One RiggedProposer per request (by BatchRequest.key), called once per round for all of them."""

    def __init__(self, rigs: dict):
        self.rigs = rigs
        first = next(iter(rigs.values()))
        self.block_size, self.target_layer_ids = first.block_size, first.target_layer_ids
        self.batched_calls = 0

    def new_cache(self, capacity):
        return None

    def propose_batch(self, rows):
        self.batched_calls += 1
        return [self.rigs[r.key].propose(r.ctx, r.bonus, r.cache, r.draft_len, r.start) for r in rows]


@pytest.mark.parametrize("method,budget", SPEC, ids=SPEC_IDS)
def test_rigged_drafter_batch_equals_batch1_with_deep_paths_and_compaction(rnd, method, budget):
    target = rnd.target
    reqs = make_requests(64, 0.0, seed=3)
    layers = rnd.proposer.target_layer_ids

    def rig(r, s):
        truth = r.prompt_ids + greedy_reference(target, r.prompt_ids, r.max_new_tokens + 17)
        return RiggedProposer(truth, 64, layers, seed=s)

    rigs = {r.key: rig(r, 5 + r.key) for r in reqs}
    keyed = KeyedRigged(rigs)
    loop = BatchLoop(target, keyed, method, budget, MAX_BATCH)
    got = loop.run(reqs)
    assert keyed.batched_calls == loop.stats.rounds  # one batched proposal per round
    non_prefix = 0
    for r, g in zip(reqs, got):
        ref = Engine(target, proposer=rig(r, 5 + r.key)).generate(r.prompt_ids, method, budget, r.max_new_tokens,
                                                                  stop_ids=r.stop_ids, record_trees=True)
        assert_same(g, ref, ("rigged", method, budget, r.key))
        non_prefix += sum(t.accepted != list(range(len(t.accepted))) for t in g.trees)
    assert max(a for g in got for a in g.accept_lengths) >= (2 if budget == 1 else 8)
    if method == "ddtree" and budget > 1:
        assert non_prefix > 0  # a sibling path was accepted: KV compaction inside one request's region
    _count("rigged", len(reqs))


def test_one_target_and_one_drafter_forward_per_round(rnd, monkeypatch):
    calls = {"target": 0, "drafter": 0}
    tf, df = batch_mod.target_forward_batch, batch_mod.drafter_forward_batch

    def count_t(*a, **k):
        calls["target"] += 1
        return tf(*a, **k)

    def count_d(*a, **k):
        calls["drafter"] += 1
        return df(*a, **k)

    monkeypatch.setattr(batch_mod, "target_forward_batch", count_t)
    monkeypatch.setattr(batch_mod, "drafter_forward_batch", count_d)
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
    reqs = make_requests(64, 0.0, seed=7)
    flag = threading.Event()
    n = {"chunks": 0}

    def bad(tokens):
        n["chunks"] += 1
        if n["chunks"] == 3:
            raise ConnectionError("client went away")

    reqs[0].on_chunk = bad
    reqs[2].cancelled = flag.is_set
    reqs[3].on_chunk = lambda toks: flag.set()  # request 2 is cancelled once request 3 produced something
    sched = BatchScheduler(rnd.batch_loop("ddtree", 16, N_REQ))
    try:
        futs = [sched.submit(r) for r in reqs]
        with pytest.raises(ConnectionError):
            futs[0].result(timeout=120)
        with pytest.raises(Cancelled):
            futs[2].result(timeout=120)
        for i in (1, 3, 4):
            assert_same(futs[i].result(timeout=120), alone(rnd, "ddtree", 16, reqs[i]), ("survivor", i))
    finally:
        sched.close()
    with pytest.raises(ValueError):
        sched.loop.check(BatchRequest([], 4))


def test_zz_case_count(capsys):
    """Prints how many request runs were compared with batch 1, per drafter (the test order puts it last)."""
    total = sum(CASES.values())
    with capsys.disabled():
        print(f"\nbatched == batch-1 request comparisons: {CASES} (total {total})")
    assert total > 0
