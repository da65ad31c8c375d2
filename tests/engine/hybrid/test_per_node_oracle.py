"""(a) Every verify-tree node's logits equal transformers' logits of its root path run as a plain sequence,
over two rounds (the second after committing a path through a later sibling), on four random tiny hybrid
configs; the per-depth fast form equals the per-node twin bit for bit (CPU fp32) and the replay commit
equals the full-state commit bit for bit; (c) the negative control (GDN over the flattened tree) fails
the same check."""

from __future__ import annotations

import pytest
import torch

from hybrid_support import CONFIGS
from ddtree_bench.engine.tree import build_tree, compile_tree, verify_mask

ATOL = 1e-4


def deep_tree(V: int, seed: int, budget: int = 40, L: int = 9):
    """A tree with siblings and root paths longer than the conv kernel (K = 4): one favoured token per depth."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(L, V, generator=g)
    logits[torch.arange(L), torch.randint(V, (L,), generator=g)] += 8.0     # a strong spine ...
    logits[torch.arange(L), torch.randint(V, (L,), generator=g)] += 6.5     # ... with a runner-up (siblings)
    return build_tree(logits, budget)


def root_paths(tree) -> list[list[int]]:
    """Node indices (verify order, root = 0) of every verify row's root path."""
    par = [0] + tree.parents.tolist()
    out = [[0]]
    for i in range(1, len(par)):
        out.append(out[par[i]] + [i])
    return out


@torch.inference_mode()
def run_round(world, cache, start: int, bonus: int, tree):
    vids, vpos, anc = compile_tree(tree, bonus, start)
    logits, _ = world.target(vids, vpos, cache, start, mask=verify_mask(anc, start))
    return vids, logits


def node_errors(world, prefix: list[int], vids, logits, tree) -> list[float]:
    """Per node: max |logit difference| to transformers on prefix + root path (inf if the argmax differs)."""
    errs = []
    for i, path in enumerate(root_paths(tree)):
        ref = world.oracle_logits(prefix + vids[path].tolist())[-1]
        d = float((logits[i] - ref).abs().max())
        errs.append(d if int(logits[i].argmax()) == int(ref.argmax()) else float("inf"))
    return errs


def sibling_path(tree) -> list[int]:
    """The deepest root path that goes through a non-first child somewhere (a later sibling)."""
    paths = root_paths(tree)
    firsts = {}
    for i, p in enumerate(tree.parents.tolist(), start=1):
        firsts.setdefault(p, i)
    later = [p for p in paths if any(firsts[p[j - 1]] != p[j] for j in range(1, len(p)))]
    return max(later, key=len)


def two_rounds(world, mode: str, commit_mode: str = "full", seed: int = 0):
    """Prefill, verify tree 1, commit a sibling path, verify tree 2. Returns (per-node errors of both rounds,
    logits of both rounds, committed states after round 1)."""
    t = world.target
    t.tree_mode, t.commit_mode = mode, commit_mode
    try:
        prompt = list(range(3, 3 + 20 + seed))
        cache = t.new_cache(200)
        with torch.inference_mode():
            lg, _ = t(torch.tensor(prompt), torch.arange(len(prompt)), cache, 0)
        bonus = int(lg[-1].argmax())
        V = t.cfg.vocab_size
        tree1 = deep_tree(V, seed)
        vids1, logits1 = run_round(world, cache, len(prompt), bonus, tree1)
        errs = node_errors(world, prompt, vids1, logits1, tree1)
        path = sibling_path(tree1)
        assert len(path) > t.cfg.conv_kernel, "the committed path should be longer than the conv kernel"
        cache.commit(len(prompt), path)
        states = {i: (s.conv.clone(), s.S.clone()) for i, s in cache.states.items()}
        prefix = prompt + vids1[path].tolist()
        bonus2 = int(logits1[path[-1]].argmax())
        tree2 = deep_tree(V, seed + 100)
        vids2, logits2 = run_round(world, cache, len(prefix), bonus2, tree2)
        errs += node_errors(world, prefix, vids2, logits2, tree2)
        return errs, (logits1, logits2), states
    finally:
        t.tree_mode, t.commit_mode = "depth", "full"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_node_equals_its_root_path_through_transformers(hybrid_worlds, name):
    world = hybrid_worlds(name)
    errs, _, _ = two_rounds(world, "depth")
    bad = [i for i, e in enumerate(errs) if not e <= ATOL]
    print(f"{name}: {len(errs)} nodes checked over 2 rounds, max |dlogit| {max(errs):.2e}, {len(bad)} wrong")
    assert not bad, f"{len(bad)}/{len(errs)} nodes differ from their root path (max {max(errs)})"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_negative_control_flat_gdn_fails_the_same_check(hybrid_worlds, name):
    world = hybrid_worlds(name)
    errs, _, _ = two_rounds(world, "flat")
    bad = [e for e in errs if not e <= ATOL]
    print(f"{name}: flat GDN (negative control): {len(bad)}/{len(errs)} nodes wrong")
    assert len(bad) >= len(errs) // 4, "the oracle must catch GDN run over the flattened tree"


@pytest.mark.parametrize("name", ["qwen3_5_text", "qwen3_next"])
def test_per_depth_equals_per_node_twin_and_replay_equals_full_state_bit_for_bit(hybrid_worlds, name):
    world = hybrid_worlds(name)
    _, (a1, a2), sa = two_rounds(world, "depth", "full")
    _, (b1, b2), sb = two_rounds(world, "node", "full")
    _, (c1, c2), sc = two_rounds(world, "depth", "replay")
    assert torch.equal(a1, b1) and torch.equal(a2, b2), "per-depth and per-node verify logits differ"
    assert torch.equal(a1, c1) and torch.equal(a2, c2)
    for i in sa:
        assert torch.equal(sa[i][1], sb[i][1]) and torch.equal(sa[i][0], sb[i][0]), f"layer {i}: committed state differs (node twin)"
        assert torch.equal(sa[i][1], sc[i][1]) and torch.equal(sa[i][0], sc[i][0]), f"layer {i}: committed state differs (replay)"
