"""explain's fast path (explain/reuse.py) against its slow obvious twin (a full replay per variant).

Scoring a drafter variant against the one reference decode must give, request for request, the
acceptance lengths and the output a full replay under that variant gives: on the toy pair, DFlash
and DDTree, for variants that touch the context features (layer ids, k_norm), the attention
(causal), the block (positions, bonus, mask id) and the draft length. Forced reuse (margin 0) is
compared, so a disagreement cannot hide behind the near-tie fallback; the fallback itself is
checked to hand requests to the full replay. The decision margins are checked on hand-made logits.
"""

from __future__ import annotations

import math

import pytest
import torch

from ddtree_bench.engine.draft_variants import REFERENCE, parse_variant
from ddtree_bench.explain import reuse
from ddtree_bench.explain.replay import ReplayRequest, replay
from ddtree_bench.engine.tree import Tree, build_tree
from engine_support import one_torch_thread  # noqa: F401 (fixture)

VARIANTS = ["causal", "layer_ids+1", "layer_ids-1", "positions+1", "bonus_as_mask", "draft_length=7",
            "mask_id=256", "ctx_k_norm=layer0", "context_window=16"]
MAX_NEW = 48


@pytest.fixture(scope="module")
def toy():
    from ddtree_bench.pair import load_pair
    from ddtree_bench.suites.prompts import load_suite

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    pair = load_pair("toy", None, "ddtree")
    prompts = load_suite("gsm8k", 3).prompts
    reqs = [ReplayRequest((p.prompt_id, 0), pair.tokenizer.apply_chat_template([{"role": "user", "content": p.turns[0]}]), MAX_NEW)
            for p in prompts]
    yield pair, reqs
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def decoded(toy):
    pair, reqs = toy
    eng, stops = pair.engine, list(pair.stop_ids)
    out = {}
    for method in ("dflash", "ddtree"):
        ref = replay(eng, reqs, method, 64, stops, REFERENCE)
        layers = reuse.layers_needed(eng, [parse_variant(v) for v in VARIANTS] + [REFERENCE])
        out[method] = (ref, reuse.decode_references(eng.target, reqs, ref, layers, eng.drafter.block_size - 1))
    return out


@pytest.mark.parametrize("method", ["dflash", "ddtree"])
@pytest.mark.parametrize("name", ["reference"] + VARIANTS)
def test_reuse_gives_what_a_full_replay_gives(toy, decoded, method, name):
    pair, reqs = toy
    eng, stops = pair.engine, list(pair.stop_ids)
    ref, refs = decoded[method]
    v = parse_variant(name)
    fast = reuse.score_variant(eng, reqs, refs, method, 64, stops, v, margin_eps=0.0, target_eps=0.0)
    assert fast.replayed_in_full == []
    slow = ref if v.is_reference else replay(eng, reqs, method, 64, stops, v)
    for r in reqs:
        assert fast.result.acceptance.rounds[r.key] == slow.acceptance.rounds[r.key], (name, r.key)
        assert fast.result.acceptance.outputs[r.key] == slow.acceptance.outputs[r.key], (name, r.key)
    assert fast.min_margin > 0


def test_the_reference_decode_is_consistent_and_reaches_past_the_cut(toy, decoded):
    pair, reqs = toy
    ref, refs = decoded["ddtree"]
    block = pair.engine.drafter.block_size
    for r in reqs:
        d = refs[r.key]
        out = ref.acceptance.outputs[r.key]
        assert d.consistent and d.tokens[: len(out)] == out
        assert len(d.tokens) == len(out) + block - 1
        n = d.prompt_len + len(d.tokens) - 1
        assert all(f.shape[0] == n for f in d.features.values())


def test_near_ties_are_handed_to_the_full_replay(toy, decoded):
    pair, reqs = toy
    eng, stops = pair.engine, list(pair.stop_ids)
    ref, refs = decoded["dflash"]
    v = parse_variant("causal")
    every = reuse.score_variant(eng, reqs[:2], refs, "dflash", 64, stops, v, margin_eps=math.inf, target_eps=0.0)
    assert every.replayed_in_full == [r.key for r in reqs[:2]]
    slow = replay(eng, reqs[:2], "dflash", 64, stops, v)
    assert every.result.acceptance.rounds == slow.acceptance.rounds
    gap = reuse.score_variant(eng, reqs[:1], refs, "dflash", 64, stops, v, margin_eps=0.0, target_eps=math.inf)
    assert gap.replayed_in_full == [reqs[0].key]


def test_chain_margin_is_the_logit_gap_of_each_decision():
    logits = torch.tensor([[5.0, 1.0, 0.0], [0.0, 3.0, 2.5], [1.0, 0.0, 0.9]])
    # y: depth 1 = 0 (argmax, gap 4), depth 2 = 1 (argmax, gap 0.5), depth 3 = 2 (argmax is 0: mismatch by 0.1)
    m, margin = reuse._chain_accept(logits, [0, 1, 2, 7])
    assert m == 2 and margin == pytest.approx(0.1)
    m, margin = reuse._chain_accept(logits, [1, 1, 2, 7])
    assert m == 0 and margin == pytest.approx(4.0)


def test_tree_margin_is_the_distance_to_the_budget_boundary():
    # two depths, vocabulary 3; budget 3: the tree keeps (0,) .6, (0,0) .42 and (1,) .3; (1,0) .21 is the best left out
    lp = torch.log(torch.tensor([[0.6, 0.3, 0.1], [0.7, 0.2, 0.1]]))
    tree = build_tree(lp, 3)
    assert tree.paths() == [(0,), (0, 0), (1,)]
    s = lambda *p: sum(float(lp[d, t]) for d, t in enumerate(p))  # noqa: E731
    m, margin = reuse._tree_accept(lp, tree, [0, 0, 9], 3)
    assert m == 2 and margin == pytest.approx(s(0, 0) - s(1, 0), abs=1e-6)
    m, margin = reuse._tree_accept(lp, tree, [0, 1, 9], 3)
    # (0, 1) is out: its distance below the lowest prefix kept, (1,)
    assert m == 1 and margin == pytest.approx(min(s(0) - s(0, 1), s(1) - s(0, 1)), abs=1e-6)
    empty_ok = reuse._tree_accept(lp, Tree(*(torch.zeros(0, dtype=torch.long),) * 3), [0, 0, 9], 3)
    assert empty_ok[0] == 0
