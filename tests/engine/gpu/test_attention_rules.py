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


def test_the_tree_kernel_rule_for_one_slot_and_over_slots_and_its_ab_knobs(monkeypatch):
    """tree_attention.wanted: a tree verify from TREE_MIN_ROWS folded rows (n = 8 nodes at 4 query heads per KV head),
    one slot's and 2+ slots' alike; DDTREE_TREE_MIN_ROWS moves both edges, DDTREE_SLOT_TREE_MIN_ROWS the slotted one
    alone; below 128 rows the tree kernel splits the prefix in RANGES_SMALL ranges, then RANGES."""
    import torch

    from ddtree_bench.engine.gpu.kernels import tree_attention as ta

    monkeypatch.setattr(ta, "available", lambda device: True)
    k = torch.zeros(8, 4, 128)
    q = {n: torch.zeros(32, n, 128) for n in (7, 8, 17, 31, 32)}   # 28, 32, 68, 124, 128 folded rows
    assert ta.TREE_MIN_ROWS == 32
    assert [ta.wanted(q[n], k) for n in (7, 8, 17)] == [False, True, True]
    assert [ta.wanted(q[n], k, slots=2) for n in (7, 8, 17)] == [False, True, True]
    assert ta.config(4 * 31, torch.bfloat16).ranges == 8 and ta.config(4 * 32, torch.bfloat16).ranges == 4
    monkeypatch.setenv("DDTREE_SLOT_TREE_MIN_ROWS", "128")
    assert ta.wanted(q[17], k) and not ta.wanted(q[31], k, slots=2) and ta.wanted(q[32], k, slots=16)
    monkeypatch.setenv("DDTREE_TREE_MIN_ROWS", "128")
    assert not ta.wanted(q[31], k) and ta.wanted(q[32], k)
    monkeypatch.delenv("DDTREE_SLOT_TREE_MIN_ROWS")
    assert not ta.wanted(q[31], k, slots=4) and ta.wanted(q[32], k, slots=4)


def test_the_tree_kernels_wide_band_fits_b_256s_rows_and_its_knobs_are_checked(monkeypatch):
    """B = 256 verifies 257 nodes, 1,028 folded rows at 4 query heads per KV head: the band above RANGES_TO takes
    64-wide key tiles over one range (128-wide ones took an SM per program and ran 136 programs on 132 SMs); the A/B
    knobs move the tile width and the ranges, and a width the kernel cannot tile is bad input."""
    import torch

    from ddtree_bench.engine.gpu.kernels import tree_attention

    c = tree_attention.config(4 * 257, torch.bfloat16)
    assert (c.block_m, c.block_n, c.ranges, c.tree_dense) == (64, 64, 1, True)
    monkeypatch.setenv("DDTREE_TREE_WIDE_BLOCK_N", "128")
    monkeypatch.setenv("DDTREE_TREE_WIDE_RANGES", "2")
    c = tree_attention.config(4 * 257, torch.bfloat16)
    assert (c.block_n, c.ranges) == (128, 2) and tree_attention.config(4 * 129, torch.bfloat16).block_n == 64
    monkeypatch.setenv("DDTREE_TREE_WIDE_BLOCK_N", "48")
    with pytest.raises(UsageError, match="DDTREE_TREE_WIDE_BLOCK_N"):
        tree_attention.config(4 * 257, torch.bfloat16)


def test_the_tree_kernels_shape_knobs_move_every_band_and_fp32_stays_single_stage(monkeypatch):
    """The A/B knobs for tile rows, warps and stages (an in-forward A/B decides the table, gpu_verify_ab.py) move the
    band each row count falls in; fp32 (the tests' twin check) keeps one stage; the top band's prefix ranges are
    n_split's unless TREE_BIG_RANGES names a count; a tile the kernel cannot take is bad input."""
    import torch

    from ddtree_bench.engine.gpu.kernels import tree_attention

    assert tree_attention.config(4 * 513, torch.bfloat16).ranges is None
    monkeypatch.setenv("DDTREE_TREE_BLOCK_M", "128")
    monkeypatch.setenv("DDTREE_TREE_WARPS", "8")
    monkeypatch.setenv("DDTREE_TREE_STAGES", "3")
    monkeypatch.setenv("DDTREE_TREE_BIG_RANGES", "2")
    for M in (4 * 64, 4 * 257, 4 * 513):
        c = tree_attention.config(M, torch.bfloat16)
        assert (c.block_m, c.warps, c.stages, c.tree_dense) == (128, 8, 3, True)
        assert tree_attention.config(M, torch.float32).stages == 1
    assert tree_attention.config(4 * 513, torch.bfloat16).ranges == 2
    assert tree_attention.config(4 * 64, torch.bfloat16).ranges == tree_attention.RANGES
    monkeypatch.setenv("DDTREE_TREE_BLOCK_M", "96")
    with pytest.raises(UsageError, match="DDTREE_TREE_BLOCK_M"):
        tree_attention.config(4 * 64, torch.bfloat16)


def test_the_tree_kernels_register_cap_is_unset_by_default_and_a_knob_for_an_ab(monkeypatch):
    """DDTREE_TREE_MAXNREG caps the tree kernel's registers a thread (ptxas .maxnreg) in every band, so three 4-warp
    programs can share an SM in an A/B; unset, ptxas picks (no cap); a count ptxas is not asked for is bad input.
    DDTREE_TREE_BLOCK_N sets every band's key tile width the same way."""
    import torch

    from ddtree_bench.engine.gpu.kernels import tree_attention

    monkeypatch.delenv("DDTREE_TREE_MAXNREG", raising=False)
    assert all(tree_attention.config(M, torch.bfloat16).maxnreg is None for M in (4 * 17, 4 * 257, 4 * 513))
    monkeypatch.setenv("DDTREE_TREE_MAXNREG", "168")
    assert {tree_attention.config(M, torch.bfloat16).maxnreg for M in (4 * 17, 4 * 257, 4 * 513)} == {168}
    monkeypatch.setenv("DDTREE_TREE_BLOCK_N", "32")   # the key tile width too, every band
    assert {tree_attention.config(M, torch.bfloat16).block_n for M in (4 * 17, 4 * 257, 4 * 513)} == {32}
    monkeypatch.setenv("DDTREE_TREE_MAXNREG", "100")
    with pytest.raises(UsageError, match="DDTREE_TREE_MAXNREG"):
        tree_attention.config(4 * 64, torch.bfloat16)


def test_split_partials_stay_fp32_unless_bf16_partials_is_named_and_fp32_inputs_never_round_them(monkeypatch):
    """attention.partial_dtype: the split-KV acc partials are fp32 by default; "bf16-partials" keeps them in a bf16 /
    fp16 activation dtype (half the traffic), never for fp32 inputs (the tests' exact twin check)."""
    import torch

    monkeypatch.delenv("DDTREE_GPU_EXPERIMENTAL", raising=False)
    assert {attention.partial_dtype(dt) for dt in (torch.bfloat16, torch.float16, torch.float32)} == {torch.float32}
    monkeypatch.setenv("DDTREE_GPU_EXPERIMENTAL", "bf16-partials")
    assert attention.partial_dtype(torch.bfloat16) == torch.bfloat16
    assert attention.partial_dtype(torch.float16) == torch.float16
    assert attention.partial_dtype(torch.float32) == torch.float32


def test_an_h100_h200_and_narrow_tiles_take_32_wide_three_stage_tiles_below_the_top_band_and_two_wide_ranges(monkeypatch):
    """On an H100 SXM or an H200 (kernels/common.is_tuned_hopper, pretended here for "cuda") config's two lower bands take
    NARROW_TILES (32-wide key tiles, three stages) and the wide band two prefix ranges; the experimental "narrow-tiles"
    gives any card the same, "narrow-off" gives those cards the table's shapes back; the top band keeps its shape, other
    cards and a call without a device the table's, fp32 its one stage, and the A/B knobs still win over all of it."""
    import torch

    from ddtree_bench.engine.gpu.kernels import tree_attention as ta

    for name in ("TREE_WIDE_RANGES", "TREE_WIDE_BLOCK_N", "TREE_BLOCK_N", "TREE_STAGES", "TREE_RANGES"):
        monkeypatch.delenv(f"DDTREE_{name}", raising=False)
    monkeypatch.setattr(ta, "is_tuned_hopper", lambda device: str(device) == "cuda")
    bf, ns = torch.bfloat16, (17, 129, 257, 513)
    monkeypatch.delenv("DDTREE_GPU_EXPERIMENTAL", raising=False)
    table = [ta.config(4 * n, bf) for n in ns]
    assert [ta.config(4 * n, bf, "cpu") for n in ns] == [ta.config(4 * n, bf, "cuda:1") for n in ns] == table
    assert [(c.block_n, c.stages) for c in table[:3]] == [(64, 2)] * 3 and table[2].ranges == 1
    h100 = [ta.config(4 * n, bf, "cuda") for n in ns]
    monkeypatch.setenv("DDTREE_GPU_EXPERIMENTAL", "narrow-tiles")
    assert [ta.config(4 * n, bf) for n in ns] == [ta.config(4 * n, bf, "cpu") for n in ns] == h100
    small, mid, wide, top = h100
    assert ta.NARROW_TILES == (32, 3)
    assert [(c.block_n, c.stages) for c in (small, mid, wide)] == [ta.NARROW_TILES] * 3
    assert (small.ranges, mid.ranges, wide.ranges) == (ta.RANGES_SMALL, ta.RANGES_FEW, 2)
    assert top == table[3]
    assert ta.config(4 * 129, torch.float32, "cuda").stages == 1
    monkeypatch.setenv("DDTREE_GPU_EXPERIMENTAL", "narrow-off")
    assert [ta.config(4 * n, bf, "cuda") for n in ns] == table
    monkeypatch.setenv("DDTREE_GPU_EXPERIMENTAL", "narrow-tiles,narrow-off")   # off wins, as pdl-off does
    assert ta.config(4 * 129, bf, "cuda") == table[1]
    monkeypatch.delenv("DDTREE_GPU_EXPERIMENTAL")
    monkeypatch.setenv("DDTREE_TREE_WIDE_RANGES", "1")
    monkeypatch.setenv("DDTREE_TREE_BLOCK_N", "64")
    assert (ta.config(4 * 257, bf, "cuda").ranges, ta.config(4 * 129, bf, "cuda").block_n) == (1, 64)


def test_one_row_combine_programs_run_as_one_warp_and_sixteen_row_ones_as_four(monkeypatch):
    """The split-KV combine's one-row programs (below COMBINE_ROWS_FROM folded rows) launch COMBINE_ROW_WARPS = 1
    warp, so the sums over the ranges stay inside a warp (faster on an H100: docs/gpu-performance.md); 16-row
    programs keep four; DDTREE_COMBINE_ROW_WARPS moves the first only, and a count the launch cannot take is bad input."""
    pytest.importorskip("triton")
    import torch

    launched = []
    monkeypatch.setattr(attention, "launch", lambda kernel, grid, *args, **kw: launched.append((grid, kw)))

    def warps_and_grid(M: int) -> tuple[int, tuple]:
        launched.clear()
        pacc = torch.zeros(3, 8, M, 128)
        pm = pl = torch.zeros(3, 8, M)
        attention.combine(pacc, pm, pl, torch.zeros(M // 4, 32 * 128), torch.tensor(0), M, M // 4, 4, 3, 8)
        (grid, kw), = launched
        return kw["num_warps"], grid

    assert attention.COMBINE_ROW_WARPS == 1 and attention.COMBINE_ROWS_FROM == 256
    assert warps_and_grid(64) == (1, (8, 64)) and warps_and_grid(252) == (1, (8, 252))
    assert warps_and_grid(256) == (4, (8, 256 // attention.COMBINE_ROWS))
    monkeypatch.setenv("DDTREE_COMBINE_ROW_WARPS", "4")
    assert warps_and_grid(64)[0] == 4 and warps_and_grid(256)[0] == 4
    monkeypatch.setenv("DDTREE_COMBINE_ROW_WARPS", "3")
    with pytest.raises(UsageError, match="DDTREE_COMBINE_ROW_WARPS"):
        warps_and_grid(64)
