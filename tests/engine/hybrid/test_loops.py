"""(b) Whole AR / DFlash / DDTree loops on random tiny hybrid targets equal transformers' greedy `generate`
token for token over many rounds - with a rigged proposer whose trees put the true token second at some
depths (accepted paths through later siblings) and accept long paths (longer than the conv kernel), and
with the random z-lab-layout drafter; (c) the negative control (flat GDN) diverges; the replay commit and
the per-node twin give the same generations; T > 0 runs agree between the exact commits for one seed;
the batched plain loop equals batch 1; Qwen3-MoE (no GDN) loops equal transformers too."""

from __future__ import annotations

import pytest

from engine_support import RiggedProposer
from hybrid_support import CONFIGS
from ddtree_bench.engine.batch import BatchLoop, BatchRequest
from ddtree_bench.engine.generate import Engine

N_NEW = 48
PROMPTS = [list(range(5, 25)), [7, 3, 99, 120, 44, 8, 8, 8, 31, 200, 17]]


def rigged(world, prompt, truth, seed=3):
    return RiggedProposer(prompt + truth, world.target.cfg.vocab_size, world.drafter.target_layer_ids, block_size=16,
                          seed=seed, p_second=0.2, p_miss=0.03)


def sibling_stats(gen) -> tuple[int, int]:
    """(rounds whose accepted path is not an index prefix, rounds accepting more than 4 nodes)."""
    sib = sum(1 for t in gen.trees if t.accepted != list(range(len(t.accepted))))
    return sib, sum(1 for t in gen.trees if len(t.accepted) > 4)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_loops_equal_transformers_greedy(hybrid_worlds, name):
    w = hybrid_worlds(name)
    rounds = sib = longp = 0
    for prompt in PROMPTS:
        truth = w.oracle_greedy(prompt, N_NEW)
        assert Engine(w.target).generate(prompt, "ar", max_new_tokens=N_NEW).output_ids == truth
        for method, budget in (("dflash", 0), ("ddtree", 24), ("ddtree", 6)):
            g = Engine(w.target, proposer=rigged(w, prompt, truth)).generate(prompt, method, budget=budget,
                                                                            max_new_tokens=N_NEW, record_trees=True)
            assert g.output_ids == truth, f"{method} B={budget} diverged from transformers' greedy"
            rounds += len(g.accept_lengths)
            s, lp = sibling_stats(g)
            sib, longp = sib + s, longp + lp
        g = Engine(w.target, w.drafter).generate(prompt, "ddtree", budget=16, max_new_tokens=24)
        assert g.output_ids == truth[:24], "the random z-lab drafter's loop diverged"
    print(f"{name}: {rounds} speculative rounds equal to transformers; {sib} accepted paths through a later sibling, "
          f"{longp} longer than the conv kernel")
    assert sib >= 3 and longp >= 3


@pytest.mark.parametrize("name", ["qwen3_5_text", "qwen3_next"])
def test_negative_control_flat_gdn_loop_diverges(hybrid_worlds, name):
    w = hybrid_worlds(name)
    prompt = PROMPTS[0]
    truth = w.oracle_greedy(prompt, N_NEW)
    w.target.tree_mode = "flat"
    try:
        g = Engine(w.target, proposer=rigged(w, prompt, truth)).generate(prompt, "ddtree", budget=24, max_new_tokens=N_NEW)
    except AssertionError:   # the rigged proposer asserts the bonus is the true token: it already diverged
        return
    finally:
        w.target.tree_mode = "depth"
    assert g.output_ids != truth, "flat GDN over the tree must not reproduce greedy decoding"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_replay_commit_and_node_twin_generate_the_same(hybrid_worlds, temperature):
    w = hybrid_worlds("qwen3_5-attn-first")
    prompt = PROMPTS[1]
    outs = []
    for tree_mode, commit_mode in (("depth", "full"), ("depth", "replay"), ("node", "full")):
        w.target.tree_mode, w.target.commit_mode = tree_mode, commit_mode
        try:
            outs.append([Engine(w.target, w.drafter).generate(prompt, m, budget=12, max_new_tokens=24,
                                                              temperature=temperature, seed=5).output_ids
                         for m in ("dflash", "ddtree")])
        finally:
            w.target.tree_mode, w.target.commit_mode = "depth", "full"
    assert outs[0] == outs[1] == outs[2]


def test_batched_plain_loop_equals_batch_1(hybrid_worlds):
    w = hybrid_worlds("qwen3_next")
    prompts = PROMPTS + [[1, 2, 3]]
    eng = Engine(w.target, w.drafter)
    for method in ("ar", "dflash", "ddtree"):
        alone = [eng.generate(p, method, budget=10, max_new_tokens=16).output_ids for p in prompts]
        loop = BatchLoop(w.target, eng.proposer, method, 10, max_batch=2)
        batched = [g.output_ids for g in loop.run([BatchRequest(p, 16) for p in prompts])]
        assert batched == alone, method
        assert max(loop.stats.batch_sizes) == 2


def test_qwen3_moe_loops_equal_transformers(hybrid_worlds):
    w = hybrid_worlds("qwen3_moe")
    prompt = PROMPTS[0]
    truth = w.oracle_greedy(prompt, N_NEW)
    assert Engine(w.target).generate(prompt, "ar", max_new_tokens=N_NEW).output_ids == truth
    g = Engine(w.target, proposer=rigged(w, prompt, truth)).generate(prompt, "ddtree", budget=24, max_new_tokens=N_NEW)
    assert g.output_ids == truth
