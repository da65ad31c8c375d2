"""Lossless at temperature 0: DFlash and DDTree emit exactly AR greedy's tokens (fp32, CPU).

The oracle is greedy decoding that recomputes the whole sequence at every step (no cache), so the
engine's AR loop is tested too. Two proposers: the seeded random DFlash drafter (accepts almost
nothing, so almost every round ends on a mismatch) and a proposer rigged to draft the greedy
continuation with controlled errors (tests/engine_support.py), which makes deep accepted paths,
non-prefix accepted paths (KV compaction), a stop token inside an accepted path and
max_new_tokens inside a round all happen; the test asserts that they did and prints tau.
Both the fast (vectorised) and slow (heap / row-copy / dict walk) engine paths run.
"""

from __future__ import annotations

import pytest
import torch

from ddtree_bench.engine.config import parse_draft_config, parse_target_config
from ddtree_bench.engine.draft import DFlashDrafter
from ddtree_bench.engine.generate import Engine
from ddtree_bench.engine.loading import random_configs, random_pair
from engine_support import RiggedProposer, greedy_reference, hidden_reference, one_torch_thread  # noqa: F401 (fixture)

BUDGETS = (1, 3, 15, 16, 64, 300)
CONFIGS = [("dflash", 0)] + [("ddtree", b) for b in BUDGETS]
RANDOM_CONFIGS = CONFIGS + [("ddtree", 0)]
MAX_NEW = 57          # the length scenario: cut inside a round
LONG = 100            # the stop scenario: ends at the stop token


@pytest.fixture(scope="module")
def world():
    target, drafter = random_pair(seed=0)
    prompt = torch.randint(0, 63, (9,), generator=torch.Generator().manual_seed(0)).tolist()
    cont = greedy_reference(target, prompt, LONG + 20)
    # stop token: one whose first appearance is well inside the output, so rounds run before it
    k = next(i for i in range(30, 70) if cont[i] not in cont[:i])
    return {
        "target": target,
        "drafter": drafter,
        "prompt": prompt,
        "cont": cont,
        "truth": prompt + cont,
        "eos": cont[k],
        "eos_index": k,
        "ref_hidden": hidden_reference(target, prompt + cont, drafter.target_layer_ids),
    }


def expected(world, scenario: str) -> list[int]:
    cont = world["cont"]
    return cont[: world["eos_index"] + 1] if scenario == "stop" else cont[:MAX_NEW]


def run(engine, world, method, budget, scenario):
    stop = [world["eos"]] if scenario == "stop" else []
    n = LONG if scenario == "stop" else MAX_NEW
    return engine.generate(world["prompt"], method, budget, max_new_tokens=n, stop_ids=stop, record_trees=True)


def test_ar_equals_uncached_greedy(world):
    engine = Engine(world["target"])
    for scenario in ("stop", "length"):
        g = run(engine, world, "ar", 0, scenario)
        assert g.output_ids == expected(world, scenario)
        assert g.finish_reason == ("stop" if scenario == "stop" else "length")
        assert g.accept_lengths == [1] * (len(g.output_ids) - 1)
    for n in (1, 2, 3):
        assert engine.generate(world["prompt"], "ar", max_new_tokens=n).output_ids == world["cont"][:n]


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "slow"])
def test_random_drafter_lossless(world, fast):
    engine = Engine(world["target"], world["drafter"], fast=fast)
    for method, budget in RANDOM_CONFIGS:
        for scenario in ("stop", "length"):
            g = run(engine, world, method, budget, scenario)
            assert g.output_ids == expected(world, scenario), (method, budget, scenario)
            assert g.finish_reason == ("stop" if scenario == "stop" else "length")
            assert all(1 <= a <= 16 for a in g.accept_lengths)
            if method == "ddtree":
                assert all(len(t.token_ids) == budget for t in g.trees)
        for n in (1, 2, 17):
            assert engine.generate(world["prompt"], method, budget, max_new_tokens=n).output_ids == world["cont"][:n]


def rounds(g, P):
    """(start, a, accepted) per round; start = absolute position of the round's root (bonus)."""
    start = P
    for a, tr in zip(g.accept_lengths, g.trees):
        yield start, a, tr.accepted
        start += a


ENGINES = {"fast": dict(fast=True), "slow": dict(fast=False), "default": dict(fast=None),
           "fastloop": dict(cuda_graphs=True)}  # fastloop: the fixed-shape loop, run without capture on CPU


@pytest.mark.parametrize("variant", list(ENGINES))
def test_rigged_proposer_lossless_deep_paths_compaction_stop_and_length(world, variant):
    P = len(world["prompt"])
    e = P + world["eos_index"]  # absolute position of the stop token
    rounds_a: dict[tuple[str, int], list[int]] = {}
    seen = {"compaction": 0, "eos_inside": 0, "length_inside": 0, "deep": 0}
    for method, budget in CONFIGS:
        for scenario in ("stop", "length"):
            rig = RiggedProposer(world["truth"], 64, world["drafter"].target_layer_ids, seed=3,
                                 exact_positions=range(e - 2, e + 3), ref_hidden=world["ref_hidden"])
            engine = Engine(world["target"], proposer=rig, **ENGINES[variant])
            g = run(engine, world, method, budget, scenario)
            assert g.output_ids == expected(world, scenario), (method, budget, scenario)
            assert rig.calls == len(g.accept_lengths) and rig.errors["second"] > 0 and rig.errors["miss"] > 0
            non_prefix = sum(acc != list(range(a)) for _, a, acc in rounds(g, P))
            if method == "dflash" or budget == 1:
                assert non_prefix == 0  # a chain's accepted nodes are always 0..a-1
            seen["compaction"] += non_prefix
            seen["deep"] += max(g.accept_lengths) >= 12
            rounds_a.setdefault((method, budget), []).extend(g.accept_lengths)
            if scenario == "stop":
                last_start, last_a, _ = list(rounds(g, P))[-1]
                # the stop token was accepted as a drafted node with more accepted nodes after it
                inside = last_start < e < last_start + last_a - 1
                seen["eos_inside"] += inside
            else:
                produced = 1 + sum(g.accept_lengths)  # prefill token + a_r tokens per round
                before_last = produced - g.accept_lengths[-1]
                seen["length_inside"] += before_last < MAX_NEW < produced
    taus = {k: sum(v) / len(v) for k, v in rounds_a.items()}  # mean a_r over both scenarios' rounds
    print(f"\nrigged proposer tau ({variant}): "
          + ", ".join(f"{m}{'' if m == 'dflash' else f'-B{b}'}={t:.2f}" for (m, b), t in taus.items()))
    for b in (64, 300):
        assert taus[("ddtree", b)] > 5.0, taus
    for b in (15, 16):  # small trees trade spine depth for siblings: deeper than a chain of errors, not always > 5
        assert taus[("ddtree", b)] > 4.0, taus
    assert taus[("ddtree", 64)] > taus[("dflash", 0)]
    assert seen["compaction"] >= 10, seen
    assert seen["deep"] >= 4, seen
    assert seen["eos_inside"] >= 4, seen
    assert seen["length_inside"] >= 4, seen


def test_budget_zero_stop_first_and_engine_reuse(world):
    """Budget 0 verifies the root alone (AR through the tree path); a stop id equal to the very first
    token ends at once; one engine serving prompts of different lengths in turn (its caches are
    reused, stale rows beyond the frontier included) gives each prompt's own greedy tokens."""
    engine = Engine(world["target"], world["drafter"], fast=True)
    g = engine.generate(world["prompt"], "ddtree", 0, max_new_tokens=20)
    assert g.output_ids == world["cont"][:20] and set(g.accept_lengths) == {1}
    for method in ("ar", "dflash", "ddtree"):
        g = engine.generate(world["prompt"], method, 16, max_new_tokens=20, stop_ids=[world["cont"][0]])
        assert g.output_ids == world["cont"][:1] and g.finish_reason == "stop"
    prompts = [world["prompt"] + world["cont"][:40], [5, 6], [7], world["prompt"][:4], world["prompt"] + world["cont"][:40]]
    want = [greedy_reference(world["target"], p, 12) for p in prompts]
    for method, budget in (("dflash", 0), ("ddtree", 64), ("ar", 0)):
        assert [engine.generate(p, method, budget, max_new_tokens=12).output_ids for p in prompts] == want


def test_streamed_chunks_logit_gaps_and_stage_times(world):
    """What servers and baselines read besides the tokens: on_chunk gets exactly the output stream,
    one chunk per round; per-token top-1/top-2 logit gaps equal AR's (same rows, same values);
    every stage is timed."""
    ar = Engine(world["target"]).generate(world["prompt"], "ar", max_new_tokens=50, return_logit_gaps=True)
    for method, budget in (("dflash", 0), ("ddtree", 64)):
        rig = RiggedProposer(world["truth"], 64, world["drafter"].target_layer_ids, seed=3)
        chunks: list[list[int]] = []
        g = Engine(world["target"], proposer=rig, fast=True).generate(
            world["prompt"], method, budget, max_new_tokens=50, on_chunk=chunks.append, return_logit_gaps=True)
        assert g.output_ids == ar.output_ids
        assert [t for c in chunks for t in c] == g.output_ids and [len(c) for c in chunks] == g.chunk_tokens
        # the prefill token, then one chunk per round that emitted anything (like the authors' loop,
        # a last round may run with the bonus already the max_new_tokens-th token and emit nothing)
        assert len(g.chunk_times_ns) == len(chunks) and len(chunks) - 1 <= len(g.accept_lengths) <= len(chunks)
        assert g.chunk_times_ns == sorted(g.chunk_times_ns)
        assert max(len(c) for c in chunks) > 5
        assert len(g.logit_gaps) == len(g.output_ids)
        assert max(abs(a - b) for a, b in zip(g.logit_gaps, ar.logit_gaps)) < 1e-4
        assert all(g.stage_ns[k] >= 0 for k in ("prefill", "draft", "tree_build", "verify", "commit"))
        assert g.t_start_ns <= g.t_first_token_ns <= g.t_done_ns


@pytest.mark.parametrize("block_size", [2, 4, 8])
def test_other_block_sizes_are_lossless(world, block_size):
    target, drafter = random_pair(seed=0, block_size=block_size)
    engine = Engine(target, drafter)
    for method, budget in (("dflash", 0), ("ddtree", 1), ("ddtree", 16), ("ddtree", 100)):
        g = engine.generate(world["prompt"], method, budget, max_new_tokens=30, record_trees=True)
        assert g.output_ids == world["cont"][:30], (block_size, method, budget)
        assert all(max(t.depths, default=0) <= block_size - 1 for t in g.trees)


class NaNProposer(RiggedProposer):
    """The rigged drafts, with NaN logits sprinkled in and whole NaN rows (an overflowing fp16 drafter)."""

    def propose(self, ctx, bonus, cache, draft_len, start):
        x = super().propose(ctx, bonus, cache, draft_len, start)
        g = torch.Generator().manual_seed(start)
        x[torch.rand(x.shape, generator=g) < 0.02] = float("nan")
        x[start % 7] = float("nan")
        return x


@pytest.mark.parametrize("variant", list(ENGINES))
def test_nan_draft_logits_stay_lossless(world, variant):
    for budget in (3, 16, 64):
        rig = NaNProposer(world["truth"], 64, world["drafter"].target_layer_ids, seed=3, p_second=0.0, p_miss=0.0)
        g = Engine(world["target"], proposer=rig, **ENGINES[variant]).generate(
            world["prompt"], "ddtree", budget, max_new_tokens=60, record_trees=True)
        assert g.output_ids == world["cont"][:60], (variant, budget)
        for t in g.trees:
            for i, (p, d) in enumerate(zip(t.parents, t.depths), start=1):
                assert 0 <= p < i and d == (t.depths[p - 1] if p else 0) + 1, (variant, budget, t.parents, t.depths)


def test_generated_mask_token_is_kept(world):
    """A generated token equal to the drafter's mask id stays in the output (z-lab's fix)."""
    tcfg_d, dcfg_d = random_configs()
    mask = world["cont"][5]
    dcfg_d["dflash_config"]["mask_token_id"] = mask
    drafter = DFlashDrafter(parse_draft_config(dcfg_d, parse_target_config(tcfg_d)))
    drafter.load_state_dict(world["drafter"].state_dict())
    engine = Engine(world["target"], drafter.eval())
    for method, budget in (("dflash", 0), ("ddtree", 16)):
        out = engine.generate(world["prompt"], method, budget, max_new_tokens=30).output_ids
        assert out == world["cont"][:30] and mask in out


@pytest.mark.parametrize("variant", ["fast", "fastloop"])
def test_the_last_round_rule(world, variant):
    """No round runs whose every token would fall past max_new_tokens (the authors' loop runs one;
    its time was charged to the method's tok/s): before the last round fewer than max_new_tokens
    tokens were out, and every round emitted something. The authors' loop (rounds while fewer than
    max_new_tokens tokens are committed to the cache) violates the first line for some n below:
    whenever a round ends exactly on max_new_tokens it runs one more. A first token that is a stop
    token still records one round (the authors do), and max_new_tokens = 1 runs none."""
    for method, budget in (("dflash", 0), ("ddtree", 16)):
        extra = 0
        for n in range(1, 41):
            rig = RiggedProposer(world["truth"], 64, world["drafter"].target_layer_ids, seed=n)
            g = Engine(world["target"], proposer=rig, **ENGINES[variant]).generate(world["prompt"], method, budget, max_new_tokens=n)
            a = g.accept_lengths
            assert g.output_ids == world["cont"][:n]
            if n == 1:
                assert a == [] and rig.calls == 0
                continue
            assert 1 + sum(a[:-1]) < n <= 1 + sum(a), (method, n, a)   # the last round was needed, no round after it
            assert len(g.chunk_tokens) == 1 + len(a) and min(g.chunk_tokens) >= 1
            extra += 1 + sum(a) == n   # here the authors' loop would have run one more round
        assert extra >= 3, "rounds ending exactly on max_new_tokens happened"
        first = world["cont"][0]
        for stop in ([first], [first, world["eos"]]):
            rig = RiggedProposer(world["truth"], 64, world["drafter"].target_layer_ids, seed=0)
            g = Engine(world["target"], proposer=rig, **ENGINES[variant]).generate(world["prompt"], method, budget,
                                                                                   max_new_tokens=30, stop_ids=stop)
            assert g.output_ids == [first] and g.finish_reason == "stop"
            assert len(g.accept_lengths) == 1 and rig.calls == 1 and g.chunk_tokens == [1]
        ar = Engine(world["target"]).generate(world["prompt"], "ar", max_new_tokens=30, stop_ids=[first])
        assert ar.output_ids == [first] and ar.accept_lengths == []   # AR has no draft round to record


def test_the_authors_final_empty_round_is_left_out_of_imported_lengths():
    """Imported baselines (the authors' .pt) carry their loop's extra round once 1 + the earlier
    rounds' lengths reach max_new_tokens; under the last-round rule it is dropped (and counted)."""
    from ddtree_bench.engine.interface import drop_final_empty_round

    assert drop_final_empty_round([5, 4, 3], 10) == ([5, 4], True)     # 1 + 9 = 10 tokens were out already
    assert drop_final_empty_round([5, 4, 3], 11) == ([5, 4, 3], False)  # the third round emitted the 11th..
    assert drop_final_empty_round([5, 4, 3], None) == ([5, 4, 3], False)
    assert drop_final_empty_round([], 4) == ([], False)
