"""The live-slot attention inside a captured CUDA graph: one capture stays right as the prefix grows
(the kernel reads the live length from the device each replay), at the real head dim 128 and a
grouped-query layout of 4, in fp32 and bf16, against SDPA over the whole cache; and the launch shapes the
tuner times beside the defaults (row blocks up to 128, the wide tree tiles) in bf16. Needs CUDA; skips
cleanly without it (tests/engine/gpu/test_attention_triton.py checks the kernel's values on a CPU
under Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from ddtree_bench.engine.gpu.forward import grouped_attend, visible_bias
from ddtree_bench.engine.gpu.graphs import Stage
from ddtree_bench.engine.gpu.tree_ops import verify_visible

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("T", [1, 17, 257])
def test_one_captured_graph_follows_the_growing_prefix(dtype, T):
    from ddtree_bench.engine.gpu.kernels.attention import live_attend

    dt, dev = getattr(torch, dtype), torch.device("cuda")
    Hq, Hkv, D, S = 32, 8, 128, 2048
    g = torch.Generator(device=dev).manual_seed(T)
    q = torch.randn(Hq, T, D, generator=g, device=dev).to(dt)
    k = torch.randn(Hkv, S, D, generator=g, device=dev).to(dt)
    v = torch.randn(Hkv, S, D, generator=g, device=dev).to(dt)
    anc = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
    start = torch.tensor(100, device=dev)
    bias = torch.zeros(Hq // Hkv * T, S, dtype=dt, device=dev)
    stage = Stage(lambda: live_attend(q, k, v, bias, start + T, start), dev, name="attend")
    tol = dict(rtol=1e-4, atol=1e-4) if dt == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    try:
        for p in (100, 700, 1500, S - T):
            start.fill_(p)
            bias.copy_(visible_bias(verify_visible(anc, start, S), dt, Hq // Hkv))
            got = stage.run()
            torch.testing.assert_close(got.float(), grouped_attend(q, k, v, bias).float(), **tol)
        assert stage.captured
    finally:
        stage.release()


@pytest.mark.parametrize("n", [1, 16, 64, 257])
def test_one_launch_and_dense_tree_variants_in_a_graph_follow_the_prefix_and_match_sdpa(n):
    """The folded combine (counters reset by the kernel itself) and the dense tree phase inside one captured
    graph, replayed at several prefix lengths: every replay gives SDPA's result with compile_tree's bias
    (bf16, head dim 128, 4 query heads per KV head, a deep built tree: depth up to 15)."""
    from ddtree_bench.engine.gpu.kernels.attention import counters, live_attend
    from ddtree_bench.engine.gpu.kernels.tree_attention import Config, tree_attend
    from ddtree_bench.engine.gpu.kernels.tree_verify import compile_tree
    from ddtree_bench.engine.tree_vector import StaticTreeBuilder

    dt, dev = torch.bfloat16, torch.device("cuda")
    Hq, Hkv, D, S, L = 32, 8, 128, 2048, 15
    g = torch.Generator(device=dev).manual_seed(n)
    q = torch.randn(Hq, n, D, generator=g, device=dev).to(dt)
    k = torch.randn(Hkv, S, D, generator=g, device=dev).to(dt)
    v = torch.randn(Hkv, S, D, generator=g, device=dev).to(dt)
    if n == 1:
        tok = par = dep = torch.empty(0, dtype=torch.long, device=dev)
    else:
        logits = torch.randn(L, 512, generator=torch.Generator().manual_seed(n)).to(dev) * 12
        tok, par, dep = StaticTreeBuilder(L, 512, n - 1, dev)(logits)
    start = torch.tensor(100, device=dev)

    def compiled():
        _, pos_, _, bias_, path_ = compile_tree(torch.zeros(1, dtype=torch.long, device=dev), tok, par, dep, start, S,
                                                dt, Hq // Hkv, L)
        return pos_, bias_, path_

    pos, bias, path = compiled()
    variants = [lambda: live_attend(q, k, v, bias, start + n, start, fold=True)]
    for dense, fold in ((True, False), (True, True), (False, True)):
        for bm, bn in ((16, 64), (64, 64)):
            c = Config(bm, bn, 4, 2, tree_dense=dense, fold=fold)
            variants.append(lambda c=c: tree_attend(q, k, v, path, pos, start, launch=c))
    stages = [Stage(f, dev, name=f"attend{i}") for i, f in enumerate(variants)]
    try:
        for p in (100, 700, 1500, S - n):
            start.fill_(p)
            new_pos, new_bias, new_path = compiled()
            pos.copy_(new_pos), bias.copy_(new_bias), path.copy_(new_path)
            want = grouped_attend(q, k, v, bias).float()
            for stage in stages:
                torch.testing.assert_close(stage.run().float(), want, rtol=2e-2, atol=2e-2)
        assert all(s.captured for s in stages)
        torch.cuda.synchronize()
        assert not counters(dev, 1).any()
    finally:
        for s in stages:
            s.release()


@pytest.mark.parametrize("n", [16, 64, 257])
def test_the_tuners_row_blocks_and_wide_tree_tiles_match_sdpa_in_bf16(n):
    """The launch shapes the tuner times beside the defaults, at the 8B shape in bf16 (head dim 128, 4 query
    heads per KV head, a wide built tree): live_attend at every row block it takes (n_split's ranges and
    fixed ones), and tree_attend at every WIDE_SHAPES tile (n_split's prefix ranges and four), gathered and dense,
    each against SDPA with compile_tree's bias."""
    from dataclasses import replace

    from ddtree_bench.engine.gpu.kernels.attention import BLOCK_MS, live_attend
    from ddtree_bench.engine.gpu.kernels.tree_attention import WIDE_SHAPES, tree_attend
    from ddtree_bench.engine.gpu.kernels.tree_verify import compile_tree
    from ddtree_bench.engine.tree_vector import StaticTreeBuilder

    dt, dev = torch.bfloat16, torch.device("cuda")
    Hq, Hkv, D, S, L, prefix = 32, 8, 128, 2048, 15, 1024
    g = torch.Generator(device=dev).manual_seed(n)
    q, k, v = (torch.randn(*s, generator=g, device=dev).to(dt) for s in ((Hq, n, D), (Hkv, S, D), (Hkv, S, D)))
    logits = torch.randn(L, 512, generator=torch.Generator().manual_seed(n)).to(dev) * 3
    tok, par, dep = StaticTreeBuilder(L, 512, n - 1, dev)(logits)
    start = torch.tensor(prefix, device=dev)
    _, pos, _, bias, path = compile_tree(torch.zeros(1, dtype=torch.long, device=dev), tok, par, dep, start, S, dt,
                                         Hq // Hkv, L)
    want = grouped_attend(q, k, v, bias).float()
    tol = dict(rtol=2e-2, atol=2e-2)
    for rows in BLOCK_MS:
        for splits in (None, 4):
            torch.testing.assert_close(live_attend(q, k, v, bias, start + n, start, splits=splits, rows=rows).float(),
                                       want, **tol)
    for c in WIDE_SHAPES:
        for splits in (None, 4):
            for dense in (False, True):
                got = tree_attend(q, k, v, path, pos, start, splits=splits, launch=replace(c, tree_dense=dense))
                torch.testing.assert_close(got.float(), want, **tol)


@pytest.mark.parametrize("C", [2, 4])
@pytest.mark.parametrize("n", [16, 64, 257])
def test_slotted_attention_in_a_graph_follows_each_slots_prefix_and_equals_one_slot_calls(C, n):
    """The batched verify's attention at the 8B shape in bf16: C slots of a slotted 2048-slot cache (views with a
    slot stride, one spare region NaN), each with its own built tree (compile_trees, one launch) at its own prefix,
    one captured graph per kernel replayed as the prefixes move apart. Every replay gives, slot by slot, SDPA's
    result with the slot's bias (the twin, grouped_attend_batch), and with the same ranges the one-slot call's bits;
    the live-slot kernel at every n, the tree kernel with config's shape and its ranges spread over the slots."""
    from ddtree_bench.engine.gpu.forward import grouped_attend as grouped_attend_batch   # its slot-axis form
    from ddtree_bench.engine.gpu.kernels.attention import live_attend
    from ddtree_bench.engine.gpu.kernels.tree_attention import config, ranges_for, tree_attend
    from ddtree_bench.engine.gpu.kernels.tree_verify import compile_trees
    from ddtree_bench.engine.tree_vector import StaticTreeBuilder

    dt, dev = torch.bfloat16, torch.device("cuda")
    Hq, Hkv, D, S, L = 32, 8, 128, 2048, 15
    g = torch.Generator(device=dev).manual_seed(n + C)
    q = torch.randn(C, Hq, n, D, generator=g, device=dev).to(dt)
    k5, v5 = (torch.randn(2, C + 1, Hkv, S, D, generator=g, device=dev).to(dt) for _ in range(2))
    k5[:, C] = float("nan")
    v5[:, C] = float("nan")
    k, v = k5[1, :C], v5[1, :C]
    trees = [StaticTreeBuilder(L, 512, n - 1, dev)(torch.randn(L, 512, generator=torch.Generator().manual_seed(n + c))
                                                   .to(dev) * (3 + 3 * c)) for c in range(C)]
    tok, par, dep = (torch.stack([t[i] for t in trees]) for i in range(3))
    start = torch.zeros(C, dtype=torch.long, device=dev)
    bonus = torch.zeros(C, dtype=torch.long, device=dev)

    def compiled():
        _, pos_, _, bias_, path_ = compile_trees(bonus, tok, par, dep, start, S, dt, Hq // Hkv, L)
        return pos_, bias_, path_

    pos, bias, path = compiled()
    cfg = config(Hq // Hkv * n, dt, dev)   # the card's shape (an H100 narrows it), the one tree_attend launches
    ns = ranges_for(cfg, C, Hkv, Hq // Hkv * n, S)
    variants = {"live": lambda: live_attend(q, k, v, bias, start + n, start),
                "live-3": lambda: live_attend(q, k, v, bias, start + n, start, splits=3),
                "tree": lambda: tree_attend(q, k, v, path, pos, start)}
    stages = {name: Stage(f, dev, name=f"slotted-{name}") for name, f in variants.items()}
    tol = dict(rtol=2e-2, atol=2e-2)
    try:
        for prefixes in ([100] * C, [100 + 400 * c for c in range(C)], [S - n - 300 * c for c in range(C)]):
            start.copy_(torch.tensor(prefixes, device=dev))
            new_pos, new_bias, new_path = compiled()
            pos.copy_(new_pos), bias.copy_(new_bias), path.copy_(new_path)
            want = grouped_attend_batch(q, k, v, bias).float()
            got = {name: stage.run() for name, stage in stages.items()}
            for name, out in got.items():
                assert torch.isfinite(out).all(), name
                torch.testing.assert_close(out.float(), want, **tol)
            for c in range(C):
                rows = slice(c * n, (c + 1) * n)
                one_live = live_attend(q[c], k[c], v[c], bias[c], start[c] + n, start[c], splits=3)
                assert torch.equal(got["live-3"][rows], one_live)
                one_tree = tree_attend(q[c], k[c], v[c], path[c], pos[rows], start[c], splits=ns, launch=cfg)
                assert torch.equal(got["tree"][rows], one_tree)
        assert all(s.captured for s in stages.values())
    finally:
        for s in stages.values():
            s.release()
