"""The fast engine path (fixed shapes, CUDA graphs) against the plain one: same trees, same walks,
same logits up to rounding, and - what matters - the same tokens, acceptance lengths and trees
through `Engine(cuda_graphs=True)`. On a CPU the fast path runs its fixed-shape code without
capture; the GPU tests at the end capture the graphs for real (skipped without CUDA).

The random drafter accepts almost nothing, so deep accepted paths, sibling acceptances (KV
compaction of a non-prefix path) and early stops come from `OracleProposer`, which drafts the
target's own greedy continuation with deterministic mistakes.
"""

from __future__ import annotations

import random

import pytest
import torch

from ddtree_bench.engine.generate import Engine
from ddtree_bench.engine.interface import WalkLayout
from ddtree_bench.engine.loading import random_pair
from ddtree_bench.engine.model import Target
from ddtree_bench.engine.gpu.forward import StaticKV, draft_forward, draft_visible, group_size, target_forward, visible_bias
from ddtree_bench.engine.tree import (
    _topk_logprobs,
    ancestor_matrix_slow,
    build_tree,
    build_tree_fast,
    verify_mask,
)
from ddtree_bench.engine.gpu.tree_ops import ancestors, commit_sources, verify_visible, walk_static
from ddtree_bench.engine.tree_vector import StaticTreeBuilder, topk_logprobs
from ddtree_bench.engine.verify import walk
from engine_support import OracleProposer, same_generation
from triton_support import tree_logits

VOCAB = 272


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threads only fight over the shared cores
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def pair():
    return random_pair(seed=0, vocab_size=VOCAB)


def greedy_truth(target: Target, prompt: list[int], n: int) -> list[int]:
    return Engine(target).generate(prompt, "ar", max_new_tokens=n).output_ids


# ---------------------------------------------------------------------------- trees


@pytest.mark.parametrize("kind", ["random", "onehot", "coarse"])
@pytest.mark.parametrize("L,V,budget", [(15, 272, 16), (15, 272, 64), (15, 272, 200), (4, 3, 50), (6, 5, 7), (1, 9, 4)])
def test_static_builder_equals_heap_and_vectorised(kind, L, V, budget):
    for seed in range(2):
        logits = tree_logits(kind, L, V, seed)
        heap = build_tree(logits, budget)
        fast = build_tree_fast(logits, budget)
        tok, par, dep = StaticTreeBuilder(L, V, budget, "cpu")(logits)
        for ours in (tok, par, dep):
            assert ours.dtype == torch.long
        assert (tok.tolist(), par.tolist(), dep.tolist()) == (heap.token_ids.tolist(), heap.parents.tolist(), heap.depths.tolist())
        assert tok.tolist() == fast.token_ids.tolist()


@pytest.mark.parametrize("kind", ["random", "onehot", "coarse"])
def test_topk_logprobs_equals_stable_sort(kind):
    logits = tree_logits(kind, 15, 272, 3)
    for k in (1, 16, 272):
        lp, ids = topk_logprobs(logits, k)
        lp2, ids2 = _topk_logprobs(logits, k)
        assert torch.equal(ids, ids2) and torch.equal(lp, lp2)


def test_ancestors_visibility_and_walk_match_the_slow_twins():
    rng = random.Random(0)
    L = 15
    for trial in range(30):
        logits = tree_logits(["random", "coarse"][trial % 2], L, 40, trial)
        budget = rng.choice([1, 5, 16, 33, 100])
        tree = build_tree(logits, budget)
        anc = ancestors(tree.parents, L)
        assert torch.equal(anc, ancestor_matrix_slow(tree.parents))
        start, cap = rng.randrange(0, 30), 200
        vis = verify_visible(anc, torch.tensor(start), cap)
        plain = verify_mask(anc, start)
        assert torch.equal(vis[:, : plain.shape[1]], plain) and not vis[:, plain.shape[1]:].any()
        # target picks that follow a random root-to-node path, then go off-tree
        T = 1 + tree.num_nodes
        ids = torch.cat([torch.tensor([7]), tree.token_ids])
        post = torch.randint(40, (T,), generator=torch.Generator().manual_seed(trial))
        node = rng.randrange(T)
        path = [i for i in range(T) if anc[node, i]]
        for p, c in zip(path, path[1:]):
            post[p] = ids[c]
        acc, bonus = walk(tree, 7, post.tolist())
        res = walk_static(ids, tree.parents, tree.depths, anc, post, L).tolist()
        layout = WalkLayout(L)
        walked = layout.read(res)
        a = walked.a
        assert len(res) == layout.size and res[layout.COUNT] == a
        assert a == len(acc) and walked.accepted == acc and walked.bonus == bonus and res[-1] == bonus
        assert [ids[0].item()] + walked.path_tokens == ids[acc].tolist()
        assert walked.new_tokens == ids[acc[1:]].tolist() + [bonus]
        a_t, src = commit_sources(torch.tensor(res), layout)
        assert src.tolist() == acc + list(range(a, L + 1))


# ---------------------------------------------------------------------------- forwards


@pytest.mark.parametrize("model_type", ["qwen3", "llama"])
def test_static_target_forward_matches_plain(model_type):
    target, _ = random_pair(seed=1, vocab_size=VOCAB, model_type=model_type)
    P, T, cap = 23, 9, 64
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(VOCAB, (P,), generator=g)
    tree_ids = torch.randint(VOCAB, (T,), generator=g)
    logits = tree_logits("random", 15, VOCAB, 5)
    tree = build_tree(logits, T - 1)
    anc = ancestors(tree.parents, 15)
    pos = P + torch.cat([torch.zeros(1, dtype=torch.long), tree.depths])

    plain_cache = target.new_cache(cap)
    target(prompt, torch.arange(P), plain_cache, 0)
    ref_logits, ref_hidden = target(tree_ids, pos, plain_cache, P, mask=verify_mask(anc, P), hidden_layers=(1, 3))

    cache = target.new_cache(cap)
    target(prompt, torch.arange(P), cache, 0)
    start = torch.tensor(P)
    bias = visible_bias(verify_visible(anc, start, cap), torch.float32, group_size(target))
    logits, hidden = target_forward(target, tree_ids, pos, StaticKV(cache), start, bias, (1, 3))
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hidden, ref_hidden, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache.k[:, :, : P + T], plain_cache.k[:, :, : P + T])


def test_static_draft_forward_matches_plain_with_padded_context(pair):
    target, drafter = pair
    cap, bs = 128, drafter.block_size
    g = torch.Generator().manual_seed(0)
    H = len(drafter.target_layer_ids) * target.cfg.hidden_size
    hist = torch.randn(40, H, generator=g)
    block = target.embed(torch.randint(VOCAB, (bs,), generator=g))
    ref_cache, cache = drafter.new_cache(cap), drafter.new_cache(cap)
    # round 1 over 30 context rows, round 2 over 3 new rows (padded to block_size in the static path)
    drafter(hist[:30], block, ref_cache, 0, 30)
    ref = drafter(hist[30:33], block, ref_cache, 30, 33)
    kv = StaticKV(cache)
    biases = [visible_bias(draft_visible(drafter, i, torch.tensor(30), bs, cap), torch.float32, group_size(drafter))
              for i in range(len(drafter.layers))]
    draft_forward(drafter, hist[:30], block, kv, torch.tensor(0), torch.tensor(30), biases)
    biases = [visible_bias(draft_visible(drafter, i, torch.tensor(33), bs, cap), torch.float32, group_size(drafter))
              for i in range(len(drafter.layers))]
    out = draft_forward(drafter, hist[30:30 + bs], block, kv, torch.tensor(30), torch.tensor(33), biases)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------- whole generations


def _both(target, drafter=None, proposer=None):
    return Engine(target, drafter, proposer=proposer), Engine(target, drafter, proposer=proposer, cuda_graphs=True)


@pytest.mark.parametrize("method,budget", [("ar", 0), ("dflash", 0), ("ddtree", 1), ("ddtree", 16), ("ddtree", 100)])
def test_fast_engine_equals_plain_random_drafter(pair, method, budget):
    plain, fast = _both(*pair)
    for prompt in ([3, 1, 4, 1, 5], list(range(20, 60))):
        same_generation(plain.generate(prompt, method, budget, 37), fast.generate(prompt, method, budget, 37))
    gen = fast.generate([9, 9], method, budget, 12)
    rounds = fast.fast_loop().rounds
    assert len(rounds) == len(gen.accept_lengths)
    want = {"verify", "walk", "commit"} if method == "ar" else {"draft", "tree_build", "tree_compile", "verify", "walk", "commit"}
    assert all(set(r) == want and all(v >= 0 for v in r.values()) for r in rounds)


@pytest.mark.parametrize("method,budget", [("dflash", 0), ("ddtree", 8), ("ddtree", 48)])
def test_fast_engine_equals_plain_deep_paths_compaction_and_stops(pair, method, budget):
    target, _ = pair
    prompt = [5, 17, 101, 33, 2, 250]
    truth = greedy_truth(target, prompt, 140)
    for seed in range(3):
        prop = OracleProposer(prompt, truth, vocab=VOCAB, seed=seed)
        plain, fast = _both(target, proposer=prop)
        a, b = plain.generate(prompt, method, budget, 90), fast.generate(prompt, method, budget, 90)
        same_generation(a, b)
        assert a.output_ids == truth[:90]
        assert max(a.accept_lengths) >= 8, "the oracle drafts deep accepted paths"
        if budget >= 32:  # sibling acceptances: the accepted path is not a prefix of the node order
            trees = fast.generate(prompt, method, budget, 90, record_trees=True).trees
            assert any(t.accepted != list(range(len(t.accepted))) for t in trees)
            assert [t.accepted for t in trees] == [t.accepted for t in plain.generate(prompt, method, budget, 90, record_trees=True).trees]
        stop = truth[40]
        same_generation(plain.generate(prompt, method, budget, 90, stop_ids=[stop]), fast.generate(prompt, method, budget, 90, stop_ids=[stop]))


def test_fast_engine_sampling_gaps_chunks_and_trees_match(pair):
    plain, fast = _both(*pair)
    prompt = list(range(30, 50))
    for method, budget in (("ar", 0), ("ddtree", 24)):
        for seed in (0, 1):
            same_generation(plain.generate(prompt, method, budget, 30, temperature=0.8, seed=seed),
                  fast.generate(prompt, method, budget, 30, temperature=0.8, seed=seed))
        a = plain.generate(prompt, method, budget, 30, return_logit_gaps=True, record_trees=True)
        seen: list[list[int]] = []
        b = fast.generate(prompt, method, budget, 30, return_logit_gaps=True, record_trees=True, on_chunk=seen.append)
        same_generation(a, b)
        assert a.chunk_tokens == b.chunk_tokens and [t for c in seen for t in c] == b.output_ids
        assert a.logit_gaps == pytest.approx(b.logit_gaps, rel=1e-4, abs=1e-4)
        if method == "ddtree":
            assert [(t.token_ids, t.parents, t.depths, t.accepted) for t in a.trees] == \
                   [(t.token_ids, t.parents, t.depths, t.accepted) for t in b.trees]


def test_fast_engine_grows_its_cache_and_keeps_going(pair):
    plain, fast = _both(*pair)
    fast.generate([1, 2, 3], "ddtree", 16, 8)
    small = fast.fast_loop().capacity
    long_prompt = list(range(10, 250))
    same_generation(plain.generate(long_prompt, "ddtree", 16, 20), fast.generate(long_prompt, "ddtree", 16, 20))
    assert fast.fast_loop().capacity > small
    same_generation(plain.generate([1, 2, 3], "ddtree", 16, 8), fast.generate([1, 2, 3], "ddtree", 16, 8))


class _FlakyBuilder(StaticTreeBuilder):
    """A builder that, on some calls (default: every other one), returns a wrong tree (the chain of
    each depth's worst kept token) and raises its certificate flag, as the Triton kernel does when it
    cannot certify."""

    def __init__(self, *a, flagged=lambda call: call % 2 == 0, log=None, **kw):
        super().__init__(*a, **kw)
        self.flag = torch.zeros(1, dtype=torch.int32)
        self.calls = 0
        self.flagged = flagged
        self.log = log   # if a list: (flagged?, draft logits) of every call

    def __call__(self, logits):
        self.calls += 1
        if self.log is not None:
            self.log.append((self.flagged(self.calls), logits.clone()))
        tok, par, dep = super().__call__(logits)
        if self.flagged(self.calls):
            self.flag += 1
            return tok.flip(0), torch.arange(tok.numel()), torch.arange(1, tok.numel() + 1).clamp(max=self.L)
        return tok, par, dep


def test_a_flagged_tree_is_rebuilt_exactly_before_commit(pair, monkeypatch):
    from ddtree_bench.engine.gpu.loop import FastLoop

    target, _ = pair
    prompt = [5, 17, 101, 33, 2, 250]
    truth = greedy_truth(target, prompt, 100)
    made = []

    def flaky(self, budget, kind):
        if kind == "torch":
            return StaticTreeBuilder(self.L, self.target.cfg.vocab_size, budget, self.device)
        made.append(_FlakyBuilder(self.L, self.target.cfg.vocab_size, budget, self.device))
        return made[-1]

    monkeypatch.setattr(FastLoop, "_builder", flaky)
    prop = OracleProposer(prompt, truth, vocab=VOCAB, seed=2)
    plain, fast = _both(target, proposer=prop)
    a = plain.generate(prompt, "ddtree", 40, 80, record_trees=True)
    b = fast.generate(prompt, "ddtree", 40, 80, record_trees=True)
    same_generation(a, b)
    assert [t.token_ids for t in a.trees] == [t.token_ids for t in b.trees]
    assert fast.fast_loop().redone_rounds == len(b.accept_lengths) // 2 > 0


@pytest.mark.parametrize("flagged", [{1, 2, 3}, {2, 4, 6, 8, 10}, {1, 5, 6, 9}], ids=["first-three", "every-other", "mixed"])
def test_flagged_rounds_with_the_dflash_drafter_queued_ahead(pair, monkeypatch, flagged):
    """With the DFlash drafter the fast loop queues the commit and the next draft before it reads a
    round's result (gpu/loop.py). A flagged round's commit must then leave every buffer as it was,
    the draft queued ahead must recompute the same draft logits, and only the exact rebuild may be
    committed - including in round 1, whose draft came from the prompt, and on consecutive flags.
    A commit that went through anyway would advance the frontier twice and change the tokens."""
    from ddtree_bench.engine.gpu.loop import FastLoop

    target, drafter = pair
    made, log, rebuilt = [], [], []

    class _Exact(StaticTreeBuilder):   # the exact rebuild: records the draft logits it was given
        def __call__(self, logits):
            rebuilt.append(logits.clone())
            return super().__call__(logits)

    def flaky(self, budget, kind):
        if kind == "torch":
            return _Exact(self.L, self.target.cfg.vocab_size, budget, self.device)
        made.append(_FlakyBuilder(self.L, self.target.cfg.vocab_size, budget, self.device, flagged=flagged.__contains__,
                                  log=log))
        return made[-1]

    ahead = []
    launch = FastLoop._launch

    def spy(self, *a, **kw):
        ahead.append(launch(self, *a, **kw))
        return ahead[-1]

    monkeypatch.setattr(FastLoop, "_builder", flaky)
    monkeypatch.setattr(FastLoop, "_launch", spy)
    plain, fast = _both(target, drafter)
    prompt = [7, 3, 19, 44, 8]
    a = plain.generate(prompt, "ddtree", 24, 40, record_trees=True)
    b = fast.generate(prompt, "ddtree", 24, 40, record_trees=True)
    same_generation(a, b)
    # Each round's committed tree is the exact tree of that round's draft logits; a flagged round's
    # rebuild saw the very logits of its flagged build (the draft queued ahead recomputed them). The
    # plain loop's trees are not the reference here: its draft forward rounds differently, so a
    # near-tie can order two sibling nodes the other way (seen on this CPU) with the same tokens.
    exact = StaticTreeBuilder(drafter.block_size - 1, target.cfg.vocab_size, 24, "cpu")
    flagged_logits = [lg for was_flagged, lg in log if was_flagged]
    assert len(rebuilt) == len(flagged_logits) == len(flagged)
    assert all(torch.equal(x, y) for x, y in zip(rebuilt, flagged_logits))
    assert len(log) == len(b.trees)   # one build per round, plus the rebuild of each flagged one
    assert [t.token_ids for t in b.trees] == [exact(lg)[0].tolist() for _, lg in log]
    same_trees = sum(x.token_ids == y.token_ids for x, y in zip(a.trees, b.trees))
    assert same_trees >= len(a.trees) - 3, "plain and fast trees differ beyond a near-tie or two"
    assert fast.fast_loop().redone_rounds == len(flagged) and made[0].calls >= max(flagged)
    assert ahead[0] is False and sum(ahead) >= len(ahead) - 20   # round 1 never drafts ahead; most later ones do


def test_no_gc_keeps_the_collector_off_during_a_capture_and_restores_it():
    """A CUDAGraph freed by the cyclic collector in the middle of another capture invalidates that
    capture (gpu/graphs.py); captures run inside no_gc, which must restore the collector even when
    the captured function raises."""
    import gc

    from ddtree_bench.engine.gpu.graphs import no_gc

    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with no_gc():
            assert not gc.isenabled()
            raise RuntimeError("capture failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with no_gc():
            pass
        assert not gc.isenabled()  # it was off before: stays off
    finally:
        gc.enable()


def test_growing_the_cache_releases_the_old_stages(pair):
    target, drafter = pair
    fast = Engine(target, drafter, cuda_graphs=True)
    fast.generate([5, 6, 7], "ddtree", 16, 8)
    loop = fast.fast_loop()
    old = [s for b in loop.buckets.values() for s in b.stages.values()]
    for s in old:
        s.out = "held"   # what a captured stage keeps (its static outputs)
    fast.generate(list(range(3, 60)), "ddtree", 16, 200)   # needs a larger cache: every bucket is rebuilt
    assert old and all(s.out is None and s.graph is None for s in old)


def test_tree_builders_outlive_cache_growth():
    """A growing cache drops every captured bucket; the tree builders (checked and, on CUDA, timed
    once per budget) are kept, so growth never re-checks or re-times them mid-session."""
    target, drafter = random_pair(seed=0, vocab_size=VOCAB)
    eng = Engine(target, drafter, cuda_graphs=True)
    loop = eng.fast_loop()
    assert loop.tree_builder(16) is None
    eng.generate(list(range(20, 30)), "ddtree", 16, 8)
    builder, cap = loop._builders[(16, "auto")], loop.capacity
    eng.generate(list(range(20, 220)), "ddtree", 16, 8)
    assert loop.capacity > cap and loop._builders[(16, "auto")] is builder
    assert loop.tree_builder(16) == "torch"   # no Triton on a CPU


def test_a_new_budgets_builder_compiles_while_the_self_tests_and_gemm_warms_run(monkeypatch):
    """A budget's first bucket runs the layer ops' and tree kernels' self-tests, its verify rows' GEMM warm and its
    round's warm (on the prompt's rows for the first draft) inside
    builders.prefetched (its tree builder compiling on a thread meanwhile: a process's first DDTree round pays the
    longest of them, not their sum), and checks the builder only after; a second budget prefetches its own."""
    from contextlib import contextmanager

    from ddtree_bench.engine.gpu import builders
    from ddtree_bench.engine.gpu.loop import FastLoop
    from ddtree_bench.engine.tree_vector import tree_nodes

    events = []

    @contextmanager
    def prefetched(L, V, budget, device, dtype, kind="auto"):
        events.append(("enter", budget))
        yield
        events.append(("exit", budget))

    choose, self_tests, warm, warm_round = builders.choose, FastLoop._self_tests, FastLoop._warm_linears, FastLoop._warm_round
    monkeypatch.setattr(builders, "prefetched", prefetched)
    monkeypatch.setattr(builders, "choose", lambda L, V, budget, *a, **k: events.append(("check", budget)) or choose(L, V, budget, *a, **k))
    monkeypatch.setattr(FastLoop, "_self_tests", lambda self: events.append(("self_tests",)) or self_tests(self))
    monkeypatch.setattr(FastLoop, "_warm_linears", lambda self, rows: events.append(("warm", rows)) or warm(self, rows))
    monkeypatch.setattr(FastLoop, "_warm_round", lambda self, method, width, greedy, guard, ctx_rows=None:
                        events.append(("round", width, guard, ctx_rows)) or warm_round(self, method, width, greedy, guard, ctx_rows))
    target, drafter = random_pair(seed=0, vocab_size=VOCAB)
    eng = Engine(target, drafter, cuda_graphs=True)
    eng.generate([5, 6, 7], "ddtree", 16, 4)
    L = eng.fast_loop().L
    for budget in (16, 64):
        if budget == 64:
            events.clear()
            eng.generate([5, 6, 7, 8], "ddtree", 64, 4)
        width = 1 + tree_nodes(L, VOCAB, budget)
        assert events[:6] == [("enter", budget), ("self_tests",), ("warm", width), ("round", width, True, 3 + (budget == 64)),
                              ("exit", budget), ("check", budget)]
        assert width == 1 + eng.fast_loop()._builders[(budget, "auto")].N


def test_a_new_shapes_first_round_is_timed_and_told_on_a_gpu_only(capsys, monkeypatch):
    """cold_s holds each (method, budget)'s first round (compiles + captures on a GPU); the stderr line that tells a
    sweep's user why its first point of a budget is slow appears for a CUDA device at COLD_NOTICE_S or more, and never
    on a CPU or below the threshold."""
    from ddtree_bench.engine.gpu import loop as fast

    target, drafter = random_pair(seed=0, vocab_size=64, dtype="float32", device="cpu")
    eng = Engine(target, drafter, cuda_graphs=True)
    eng.generate([1, 2, 3, 4, 5], "ddtree", 8, 6)
    first = dict(eng.fast_loop().cold_s)
    eng.generate([1, 2, 3, 4, 5], "ddtree", 8, 6)   # the same bucket: not a first round again
    assert eng.fast_loop().cold_s == first
    eng.generate([1, 2, 3], "ar", 0, 4)
    assert set(eng.fast_loop().cold_s) == {("ddtree", 8), ("ar", 0)} and all(s > 0 for s in eng.fast_loop().cold_s.values())
    assert "[ddtree-bench]" not in capsys.readouterr().err   # a CPU: nothing said
    fast.cold_notice("ddtree B=64", 5.6, torch.device("cuda"))
    fast.cold_notice("ddtree B=16", fast.COLD_NOTICE_S / 2, torch.device("cuda"))
    err = capsys.readouterr().err
    assert "[ddtree-bench] ddtree B=64: first round 5.6 s, compiling and capturing its GPU kernels" in err
    assert "B=16" not in err
