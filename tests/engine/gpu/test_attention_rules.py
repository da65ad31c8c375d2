"""The live-slot kernel's launch-shape rules (kernels/attention.py), which need no GPU: rows per program for one
slot and over several (slot_rows), and the A/B knob that overrides the latter. The kernels themselves are
checked in test_attention_triton.py / test_batch_attention_triton.py.
"""

from __future__ import annotations

import pytest

from ddtree_bench.engine.gpu.kernels import attention
from ddtree_bench.errors import UsageError


def test_one_slot_keeps_block_m_and_wide_rows_only_for_mid_sized_slotted_blocks():
    for M in (4, 64, 68, 128, 132, 516, 1024):
        assert attention.slot_rows(M, 1) == attention.block_m(M)   # the single loop's launch, unchanged
    # DDTree B = 16 (68 folded rows) over 4+ slots takes the wide rows, over 2 one slot's; AR (4) and DFlash (64) never
    assert attention.slot_rows(68, 4) == attention.slot_rows(68, 16) == attention.SLOT_WIDE_ROWS
    assert attention.slot_rows(68, 2) == attention.block_m(68) != attention.SLOT_WIDE_ROWS
    assert attention.slot_rows(4, 16) == attention.block_m(4) and attention.slot_rows(64, 16) == attention.block_m(64)
    assert attention.slot_rows(260, 16) == attention.block_m(260)


def test_the_ab_knob_overrides_over_slots_only_and_refuses_other_sizes(monkeypatch):
    monkeypatch.setenv("DDTREE_SLOT_ROWS", "128")
    assert attention.slot_rows(4, 16) == 128 and attention.slot_rows(4, 1) == attention.block_m(4)
    monkeypatch.setenv("DDTREE_SLOT_ROWS", "48")
    with pytest.raises(UsageError, match="DDTREE_SLOT_ROWS"):
        attention.slot_rows(68, 2)


def test_the_tree_kernel_rule_over_slots_and_its_ab_knob(monkeypatch):
    """tree_attention.wanted: from TREE_MIN_ROWS folded rows for one slot and (by default) over slots; the A/B knob
    DDTREE_SLOT_TREE_MIN_ROWS moves the edge over 2+ slots only."""
    import torch

    from ddtree_bench.engine.gpu.kernels import tree_attention

    monkeypatch.setattr(tree_attention, "available", lambda device: True)
    k = torch.zeros(8, 4, 128)
    q65, q16 = torch.zeros(32, 65, 128), torch.zeros(32, 17, 128)   # 260 and 68 folded rows
    assert tree_attention.wanted(q65, k) and tree_attention.wanted(q65, k, slots=2)
    assert not tree_attention.wanted(q16, k) and not tree_attention.wanted(q16, k, slots=4)
    monkeypatch.setenv("DDTREE_SLOT_TREE_MIN_ROWS", "100000")
    assert tree_attention.wanted(q65, k) and not tree_attention.wanted(q65, k, slots=2)
