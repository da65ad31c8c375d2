"""Shared by the two batched-loop test files (tests/engine/test_batch.py for the plain BatchLoop,
tests/engine/gpu/test_batch_loop.py for the fixed-shape BatchFastLoop): the request mix, the two
engines, the batch-1 and plain-batch references they compare against, the rigged per-request
proposer, and the comparison itself.

The references are pure functions of (engine, method, budget, request values) - every run is
seeded, and seed None means 0 - so each is computed once per session and shared by both files
(and by the cases of one file that ask for the same one): the same assertions against the same
values, without recomputing them. A batch run is remembered only for requests without callbacks. The
engines are built once per session (`rnd`, `toy` fixtures); a test that builds its own Engine
gets its own entries (the memo holds the engine itself, so no other engine can take its place).
Knows the batched loops' interfaces; nothing of any one test's assertions.
"""

from __future__ import annotations

import threading
from functools import cache

import pytest
import torch

from ddtree_bench.engine.batch import BatchLoop, BatchRequest, Cancelled
from ddtree_bench.engine.batch_scheduler import BatchScheduler
from ddtree_bench.engine.generate import Engine
from ddtree_bench.engine.loading import load_drafter, load_target, random_pair
from ddtree_bench.pair import TOY_DIR
from engine_support import RiggedProposer, greedy_reference

TEXTS = ("Q: 2+3? A:", "The cat sat on the", "Once upon a time, in a small", "x", "Hello, my name is")
LENS = (3, 11, 6, 17, 8)       # prompt lengths of the random-token requests
NEWS = (23, 9, 31, 17, 1)      # max_new_tokens: one request needs no round at all
N_REQ = len(LENS)
RANDOM_VOCAB = 64              # random_pair's vocabulary


@cache
def random_engine() -> Engine:
    return Engine(*random_pair(seed=0))


@cache
def toy_engine() -> Engine:
    target = load_target(TOY_DIR / "target", "float32", "cpu")
    return Engine(target, load_drafter(TOY_DIR / "draft", target.cfg, "float32", "cpu"))


@pytest.fixture(scope="module")
def rnd():
    """The seeded random pair (one Engine for the session)."""
    return random_engine()


@pytest.fixture(scope="module")
def toy():
    """The bundled trained toy pair, fp32 on the CPU (one Engine for the session)."""
    return toy_engine()


def make_requests(vocab: int, T: float, seed: int, stops: dict[int, int] | None = None, text: bool = False,
                  lens=LENS, news=NEWS, gaps: bool = False) -> list[BatchRequest]:
    """Mixed requests: prompt i is random ids (seeded) or TEXTS[i]'s bytes; request 1 is greedy whatever
    T, request 2 has top_p 0.9, request 3 has no seed (0); `stops` gives request i a stop id."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, (n, m) in enumerate(zip(lens, news)):
        prompt = list(TEXTS[i].encode()) if text else torch.randint(0, vocab - 2, (n,), generator=g).tolist()
        out.append(BatchRequest(prompt, max_new_tokens=m, temperature=T if i != 1 else 0.0, seed=1000 + i if i != 3 else None,
                                top_p=0.9 if i == 2 else 1.0, stop_ids=[stops[i]] if stops and i in stops else (),
                                record_trees=True, return_logit_gaps=gaps, key=i))
    return out


def _values(r: BatchRequest) -> tuple:
    """What a run of r depends on (a batch-1 reference ignores the callbacks: Engine.generate gets none)."""
    return (tuple(r.prompt_ids), r.max_new_tokens, r.temperature, r.top_p, r.seed, tuple(r.stop_ids), r.record_trees,
            r.return_logit_gaps, r.key)


def _has_callbacks(r: BatchRequest) -> bool:
    return r.on_chunk is not None or r.cancelled is not None


_BATCH1: dict = {}
_PLAIN: dict = {}
_TRUTH: dict = {}
_RIGGED: dict = {}


def alone(engine: Engine, method: str, budget: int, r: BatchRequest):
    """The request's batch-1 run (`Engine.generate`, the plain loop), computed once per session."""
    key = (engine, method, budget, _values(r))
    if key not in _BATCH1:
        _BATCH1[key] = engine.generate(r.prompt_ids, method, budget, r.max_new_tokens, r.temperature, r.top_p, r.seed,
                                       r.stop_ids, record_trees=r.record_trees, return_logit_gaps=r.return_logit_gaps)
    return _BATCH1[key]


def plain_batch(engine: Engine, method: str, budget: int, slots: int, reqs: list[BatchRequest]):
    """(results, loop) of `engine.batch_loop(method, budget, slots).run(reqs)`, computed once per session."""
    assert not any(map(_has_callbacks, reqs)), "a batch whose requests call back is not remembered"
    key = (engine, method, budget, slots, tuple(map(_values, reqs)))
    if key not in _PLAIN:
        loop = engine.batch_loop(method, budget, slots)
        _PLAIN[key] = (loop.run(reqs), loop)
    return _PLAIN[key]


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
        toks = alone(engine, "ar", 0, BatchRequest(r.prompt_ids, r.max_new_tokens)).output_ids
        k = next((j for j in range(3, len(toks)) if toks[j] not in toks[:j]), None)
        if k is not None:
            out[i] = toks[k]
    return out


def requests_with_stops(engine: Engine, T: float, seed: int) -> list[BatchRequest]:
    """make_requests over the random pair's vocabulary, requests 0 and 2 with stop ids from stops_from."""
    return make_requests(RANDOM_VOCAB, T, seed, stops=stops_from(engine, make_requests(RANDOM_VOCAB, T, seed)))


def assert_lengths_and_stops(got, T: float) -> None:
    """Some request ran to max_new_tokens; at T = 0 the greedy stop ids ended some inside a round."""
    assert any(g.finish_reason == "length" for g in got)
    if T == 0.0:
        assert any(g.finish_reason == "stop" for g in got)


# -- the rigged proposer, one per request ----------------------------------------------------------

RIG_SEED = 5   # request k's rig is seeded RIG_SEED + k
RIG_EXTRA = 17  # the greedy truth runs this far past max_new_tokens (the last round drafts past the end)


def truth(target, r: BatchRequest) -> list[int]:
    """Prompt + the target's greedy continuation (recomputed from scratch each step), once per session."""
    key = (target, tuple(r.prompt_ids), r.max_new_tokens)
    if key not in _TRUTH:
        _TRUTH[key] = r.prompt_ids + greedy_reference(target, r.prompt_ids, r.max_new_tokens + RIG_EXTRA)
    return _TRUTH[key]


def rig(engine: Engine, r: BatchRequest) -> RiggedProposer:
    """A fresh RiggedProposer drafting request r's greedy truth (its state starts new every call)."""
    return RiggedProposer(truth(engine.target, r), engine.target.cfg.vocab_size, engine.proposer.target_layer_ids,
                          seed=RIG_SEED + r.key)


class KeyedRigged:
    """One RiggedProposer per request (by BatchRequest.key), called once per round for all of them."""

    def __init__(self, engine: Engine, reqs: list[BatchRequest]):
        self.rigs = {r.key: rig(engine, r) for r in reqs}
        first = next(iter(self.rigs.values()))
        self.block_size, self.target_layer_ids = first.block_size, first.target_layer_ids
        self.batched_calls = 0

    def new_cache(self, capacity):
        return None

    def propose_batch(self, rows):
        self.batched_calls += 1
        return [self.rigs[r.key].propose(r.ctx, r.bonus, r.cache, r.draft_len, r.start) for r in rows]


def rigged_alone(engine: Engine, method: str, budget: int, r: BatchRequest):
    """Request r alone with its own rig drafting (batch 1), computed once per session."""
    key = ("alone", engine, method, budget, _values(r))
    if key not in _RIGGED:
        _RIGGED[key] = Engine(engine.target, proposer=rig(engine, r)).generate(
            r.prompt_ids, method, budget, r.max_new_tokens, stop_ids=r.stop_ids, record_trees=True)
    return _RIGGED[key]


def rigged_plain(engine: Engine, method: str, budget: int, slots: int, reqs: list[BatchRequest]):
    """(results, loop, keyed proposer) of a BatchLoop over reqs with one rig per request, once per session."""
    assert not any(map(_has_callbacks, reqs)), "a batch whose requests call back is not remembered"
    key = ("plain", engine, method, budget, slots, tuple(map(_values, reqs)))
    if key not in _RIGGED:
        keyed = KeyedRigged(engine, reqs)
        loop = BatchLoop(engine.target, keyed, method, budget, slots)
        _RIGGED[key] = (loop.run(reqs), loop, keyed)
    return _RIGGED[key]


# -- shared scenarios -------------------------------------------------------------------------------

def count_forwards(monkeypatch, module, target_fn: str, drafter_fn: str) -> dict[str, int]:
    """Counts the calls of module.<target_fn> and module.<drafter_fn> (monkeypatched for the test)."""
    calls = {"target": 0, "drafter": 0}
    for what, name in (("target", target_fn), ("drafter", drafter_fn)):
        def counted(*a, _real=getattr(module, name), _what=what, **k):
            calls[_what] += 1
            return _real(*a, **k)
        monkeypatch.setattr(module, name, counted)
    return calls


def one_fails_one_cancelled(engine: Engine, loop, reqs: list[BatchRequest]) -> BatchScheduler:
    """Runs reqs through a BatchScheduler over `loop` (a DDTree-16 batched loop of `engine`): request 0's
    on_chunk raises at its third chunk, request 2 is cancelled once request 3 produced something. Request
    0 must fail with that error, request 2 with Cancelled, and 1, 3, 4 equal their batch-1 runs. Returns
    the (closed) scheduler."""
    flag = threading.Event()
    n = {"chunks": 0}

    def bad(tokens):
        n["chunks"] += 1
        if n["chunks"] == 3:
            raise ConnectionError("client went away")

    reqs[0].on_chunk = bad
    reqs[2].cancelled = flag.is_set
    reqs[3].on_chunk = lambda toks: flag.set()
    sched = BatchScheduler(loop)
    try:
        futs = [sched.submit(r) for r in reqs]
        with pytest.raises(ConnectionError):
            futs[0].result(timeout=120)
        with pytest.raises(Cancelled):
            futs[2].result(timeout=120)
        for i in (1, 3, 4):
            assert_same(futs[i].result(timeout=120), alone(engine, "ddtree", 16, reqs[i]), ("survivor", i))
    finally:
        sched.close()
    return sched


class FlakySlotted:
    """The slotted Triton tree builder's stand-in on a CPU: the exact batched builder's trees, except on the calls in
    `flagged`, where it returns wrong trees (every slot a reversed chain) and raises its one certificate flag, as the
    kernel does when any slot cannot certify - so the guarded layout and the exact redo run."""

    name = "flaky-slotted"

    def __init__(self, exact, flagged=()):
        self.exact, self.flagged, self.calls, self.N = exact, set(flagged), 0, exact.N
        self.flag = torch.zeros(1, dtype=torch.int32)

    def __call__(self, logits):
        from ddtree_bench.engine.gpu.batch_tree import BatchTrees

        self.calls += 1
        trees = self.exact(logits)
        if self.calls not in self.flagged:
            return trees
        self.flag += 1
        C, N = trees.token_ids.shape
        ar = torch.arange(N).expand(C, N)
        return BatchTrees(trees.token_ids.flip(1), ar.contiguous(), (ar + 1).clamp(max=self.exact.L).contiguous())
