"""(a) Every verify-tree node's logits equal transformers' logits of its root path run as a plain sequence,
over two rounds (the second after committing a path through a later sibling), on four random tiny hybrid
configs; the per-depth fast form equals the per-node twin bit for bit (CPU fp32) and the replay commit
equals the full-state commit bit for bit; (c) the negative control (GDN over the flattened tree) fails
the same check."""

from __future__ import annotations

import pytest
import torch

from hybrid_support import ATOL, CONFIGS, two_rounds


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
