"""The attention kernels' slot axis (kernels/attention.live_attend, kernels/tree_attention.tree_attend with a leading
slot dimension) and the batched forwards that use them (batch_forward.target_forward_batch with `tree_path`,
draft_forward_batch): C slots of a slotted cache with DIFFERENT prefixes, frontiers and trees give, slot by slot,
the one-slot kernel's bits (same ranges) and SDPA's values (the twin, grouped_attend_batch); a slot reads nothing
of another slot's region (every other region NaN, its rows unchanged); a whole batched verify with the tree path
equals forward.target_forward slot by slot. They run on CUDA, and in CI on a CPU under Triton's interpreter
(engine/gpu/test_triton_interpreter.py), at small shapes:
    TRITON_INTERPRET=1 python -m pytest -m gpu tests/engine/gpu/test_batch_attention_triton.py
"""

from __future__ import annotations

import pytest
import torch

from ddtree_bench.engine.gpu.batch_forward import draft_forward_batch, target_forward_batch
from ddtree_bench.engine.gpu.forward import grouped_attend as grouped_attend_batch   # its slot-axis form
from ddtree_bench.engine.gpu.forward import StaticKV, draft_visible, group_size, target_forward, visible_bias
from ddtree_bench.engine.gpu.tree_ops import ancestors, verify_visible
from ddtree_bench.engine.loading import random_pair

from tree_attention_support import random_tree as _random_tree
from triton_support import DEV, triton_only

TOL = dict(rtol=2e-5, atol=2e-5)
Hq, Hkv, D, S, L = 4, 2, 16, 128, 4
SLOTS = 4   # regions of the slotted cache; a call takes the first C


def _slotted(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """k, v [layers=2, SLOTS, Hkv, S + 64, D], the 64 spare slots of every region NaN; the tests attend over
    _region(x, C): layer 1's first C regions cut to S slots (strided views: slot, head and slot strides all free)."""
    g = torch.Generator().manual_seed(seed)
    out = tuple(torch.randn(2, SLOTS, Hkv, S + 64, D, generator=g).to(DEV) for _ in range(2))
    for x in out:
        x[..., S:, :] = float("nan")
    return out


def _region(x: torch.Tensor, C: int) -> torch.Tensor:
    return x[1, :C, :, :S]


def _trees(C: int, N: int, starts: list[int], seed: int):
    """C different random trees of N nodes at prefixes `starts`: path [C, 1+N, L+1], pos [C*(1+N)], prefix [C],
    bias [C, g*(1+N), S] (the trees' ancestor bias, compile_tree's)."""
    paths, pos, bias = [], [], []
    for c in range(C):
        par, dep, path = _random_tree(N, L, seed=seed + 17 * c)
        st = torch.tensor(starts[c], device=DEV)
        paths.append(path.to(DEV))
        pos.append(st + torch.cat([torch.zeros(1, dtype=torch.long), dep]).to(DEV))
        bias.append(visible_bias(verify_visible(ancestors(par.to(DEV), L), st, S), torch.float32, Hq // Hkv))
    return torch.stack(paths), torch.cat(pos), torch.tensor(starts, device=DEV), torch.stack(bias)


def _poisoned(x: torch.Tensor, keep: int) -> torch.Tensor:
    """x with every region of layer 1 but `keep` (the called slots and the spare ones) set to NaN."""
    y = x.clone()
    for c in range(SLOTS):
        if c != keep:
            y[1, c] = float("nan")
    return y


STARTS = [37, 5, 90]   # a different committed prefix per slot


@pytest.mark.gpu
@triton_only
@pytest.mark.parametrize("C", [1, 2, 3])
def test_slotted_live_attend_is_the_one_slot_kernel_slot_by_slot_and_reads_only_its_region(C):
    """Live-slot kernel over C regions (frontiers 37 / 5 / 90, each slot its own tree bias): with fixed ranges
    (1, 3, and 3 folded) the slotted call gives each slot the one-slot call's bits, with n_split's ranges SDPA's
    values; with the prefix shortcut and without; every other region NaN leaves a slot's rows as they were."""
    from ddtree_bench.engine.gpu.kernels.attention import live_attend

    T = 6
    k5, v5 = _slotted(C)
    k, v = _region(k5, C), _region(v5, C)
    assert k.stride(0) == Hkv * (S + 64) * D and not k.is_contiguous()
    _, _, st, bias = _trees(C, T - 1, STARTS[:C], seed=C)
    g = torch.Generator().manual_seed(C + 100)
    q = torch.randn(C, Hq, T, D, generator=g).to(DEV)
    live = st + T
    want = grouped_attend_batch(q, k, v, bias)
    for prefix in (st, None):
        pre = (lambda c: prefix[c]) if prefix is not None else (lambda c: None)
        for splits, fold in ((1, False), (3, False), (3, True)):
            got = live_attend(q, k, v, bias, live, prefix, splits=splits, fold=fold)
            assert got.shape == (C * T, Hq * D)
            for c in range(C):
                one = live_attend(q[c], k[c], v[c], bias[c], live[c], pre(c), splits=splits, fold=fold)
                assert torch.equal(got[c * T:(c + 1) * T], one), (c, splits, fold)
        torch.testing.assert_close(live_attend(q, k, v, bias, live, prefix), want, **TOL)
    full = live_attend(q, k, v, bias, live, st, splits=3)
    for c in range(C):
        kp, vp = _poisoned(k5, c), _poisoned(v5, c)
        got = live_attend(q, _region(kp, C), _region(vp, C), bias, live, st, splits=3)[c * T:(c + 1) * T]
        assert torch.isfinite(got).all() and torch.equal(got, full[c * T:(c + 1) * T])


@pytest.mark.gpu
@triton_only
@pytest.mark.parametrize("C", [1, 3] if DEV == "cpu" else [1, 2, 3])   # the interpreter (CI): one and several slots
def test_slotted_tree_attend_is_the_one_tree_kernel_slot_by_slot_and_reads_only_its_region(C):
    """Tree kernel over C regions, each slot its own tree (same width, different shapes) at its own prefix: with
    fixed ranges and launch shapes (gathered and dense tree phase, combine after or folded) each slot gets the
    one-tree call's bits; the default launch (config's ranges spread over the slots) SDPA's values with each
    slot's bias; every other region NaN leaves a slot's rows as they were."""
    from ddtree_bench.engine.gpu.kernels.tree_attention import Config, tree_attend, vis_words

    N = 9
    T = N + 1
    k5, v5 = _slotted(10 + C)
    k, v = _region(k5, C), _region(v5, C)
    path, pos, st, bias = _trees(C, N, STARTS[:C], seed=10 + C)
    g = torch.Generator().manual_seed(C + 200)
    q = torch.randn(C, Hq, T, D, generator=g).to(DEV)
    want = grouped_attend_batch(q, k, v, bias)
    launches = ((1, Config(16, 16, 4, 1)), (2, Config(16, 16, 4, 1, tree_dense=True)),
                (2, Config(16, 16, 4, 1, tree_dense=True, fold=True)))
    for splits, launch in launches:
        got = tree_attend(q, k, v, path, pos, st, splits=splits, launch=launch)
        assert got.shape == (C * T, Hq * D)
        for c in range(C):
            one = tree_attend(q[c], k[c], v[c], path[c], pos[c * T:(c + 1) * T], st[c], splits=splits, launch=launch)
            assert torch.equal(got[c * T:(c + 1) * T], one), (c, splits, launch)
        if launch.tree_dense:   # each slot's visibility words (one vis_words call for every slot): the same bits
            assert torch.equal(tree_attend(q, k, v, path, pos, st, splits=splits, launch=launch,
                                           words=vis_words(path, pos, st)), got)
        torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(tree_attend(q, k, v, path, pos, st), want, **TOL)
    full = tree_attend(q, k, v, path, pos, st, splits=2, launch=launches[1][1])
    for c in range(C):
        kp, vp = _poisoned(k5, c), _poisoned(v5, c)
        got = tree_attend(q, _region(kp, C), _region(vp, C), path, pos, st, splits=2, launch=launches[1][1])[c * T:(c + 1) * T]
        assert torch.isfinite(got).all() and torch.equal(got, full[c * T:(c + 1) * T])


def test_the_tree_kernels_tuned_ranges_spread_over_the_slots(monkeypatch):
    """One slot keeps config's tuned prefix ranges (today's launch); C slots bring C times the programs, so the
    count is ceil(ranges / C), never below one; small trees (B = 16's 68 folded rows) spread SLOT_RANGES_SMALL = 16
    instead, so two slots keep one slot's eight ranges (and, by the slot-by-slot bit test above, its sums' order);
    DDTREE_TREE_SLOT_RANGES moves that count; a shape without tuned ranges takes n_split over C * Hkv programs."""
    pytest.importorskip("triton")
    from ddtree_bench.engine.gpu.kernels.attention import n_split
    from ddtree_bench.engine.gpu.kernels.tree_attention import Config, config, ranges_for

    c = Config(64, 64, 4, 2, tree_dense=True, ranges=4)
    assert [ranges_for(c, C, 8, 260, 2048) for C in (1, 2, 3, 4, 16)] == [4, 2, 2, 1, 1]
    small = config(68, torch.bfloat16)
    assert small.ranges == 8
    assert [ranges_for(small, C, 8, 68, 2048) for C in (1, 2, 3, 4, 16)] == [8, 8, 6, 4, 1]
    monkeypatch.setenv("DDTREE_TREE_SLOT_RANGES", "8")
    small = config(68, torch.bfloat16)
    assert [ranges_for(small, C, 8, 68, 2048) for C in (1, 2, 4)] == [8, 4, 2]
    assert ranges_for(c, 1, 8, 260, 128) == 2   # at most one per block_n slots, as before
    wide = Config(64, 64, 4, 3)
    assert ranges_for(wide, 1, 8, 2000, 4096) == n_split(8, 2000, 4096, 64, 64)
    assert ranges_for(wide, 4, 8, 2000, 4096) == n_split(32, 2000, 4096, 64, 64) == 1


def _prefilled(target, prompts: list[torch.Tensor], cap: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Slotted K/V [layers, C, Hkv, cap, D] with slot c's prompt prefilled by the plain forward (the rest zero)."""
    ks, vs = [], []
    for p in prompts:
        cache = target.new_cache(cap)
        target(p, torch.arange(p.shape[0], device=DEV), cache, 0)
        ks.append(cache.k)
        vs.append(cache.v)
    return torch.stack(ks, dim=1), torch.stack(vs, dim=1)


@pytest.mark.gpu
@triton_only
def test_a_batched_tree_verify_with_the_path_equals_the_single_verify_slot_by_slot(monkeypatch):
    """target_forward_batch over 3 slots (prompts of 21, 9 and 30 tokens, a different built tree each, compiled by
    compile_trees in one launch) with its path tables: attention="tree" and auto with the fused ops (the tree
    kernel, counted, once the trees reach TREE_MIN_ROWS; the live kernel one row short) give, slot by slot, what
    forward.target_forward gives on that slot's own cache with its own tree (fp32), logits, hidden states and the
    K/V written; "live" and "sdpa" (the twin) agree too."""
    from ddtree_bench.engine.gpu.fused import TritonOps
    from ddtree_bench.engine.gpu.kernels import tree_attention
    from ddtree_bench.engine.gpu.kernels.tree_verify import compile_trees
    from ddtree_bench.engine.tree_vector import StaticTreeBuilder

    target, _ = random_pair(seed=6, vocab_size=97, device=DEV)
    Lt, B, cap = 4, 10, 64
    T = B + 1
    lens = [21, 9, 30]
    C = len(lens)
    prompts = [(torch.arange(1, n + 1, device=DEV) * (c + 2)) % 97 for c, n in enumerate(lens)]
    trees = [StaticTreeBuilder(Lt, 97, B, DEV)(torch.randn(Lt, 97, generator=torch.Generator().manual_seed(9 + c)).to(DEV) * 3)
             for c in range(C)]
    tok, par, dep = (torch.stack([t[i] for t in trees]) for i in range(3))
    start = torch.tensor(lens, device=DEV)
    bonus = torch.tensor([5, 6, 7], device=DEV)
    ids, pos, _, bias, path = compile_trees(bonus, tok, par, dep, start, cap, torch.float32, group_size(target), Lt)
    assert path.shape == (C, T, Lt + 1)
    layers = (0, 1)

    singles = []   # forward.target_forward per slot, its own cache and tree, SDPA (the twin)
    for c in range(C):
        k, v = _prefilled(target, [prompts[c]], cap)
        kv = StaticKV(target.new_cache(cap))
        kv.cache.k.copy_(k[:, 0])
        kv.cache.v.copy_(v[:, 0])
        rows = slice(c * T, (c + 1) * T)
        logits, hidden = target_forward(target, ids[rows], pos[rows], kv, start[c], bias[c], layers, attention="sdpa")
        singles.append((logits, hidden, kv.cache.k.clone()))

    calls, real = [], tree_attention.tree_attend
    monkeypatch.setattr(tree_attention, "tree_attend", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    rows_folded = group_size(target) * T
    triton_ops = TritonOps()
    n_layers = len(target.model.layers)
    for name, attention, ops, min_rows, tree_calls in (("tree", "tree", None, None, n_layers),
                                                      ("auto", "auto", triton_ops, rows_folded, n_layers),
                                                      ("auto-live", "auto", triton_ops, rows_folded + 1, 0),
                                                      ("live", "live", None, None, 0), ("sdpa", "sdpa", None, None, 0)):
        if min_rows is not None:
            monkeypatch.setattr(tree_attention, "TREE_MIN_ROWS", min_rows)
        k, v = _prefilled(target, prompts, cap)
        calls.clear()
        logits, hidden = target_forward_batch(target, ids, pos, k, v, start, bias, layers, ops=ops, tree_path=path,
                                              attention=attention)
        assert len(calls) == tree_calls, name
        for c, (s_logits, s_hidden, s_k) in enumerate(singles):
            rows = slice(c * T, (c + 1) * T)
            torch.testing.assert_close(logits[rows], s_logits, rtol=1e-4, atol=1e-4, msg=name)
            torch.testing.assert_close(hidden[rows], s_hidden, rtol=1e-4, atol=1e-4, msg=name)
            torch.testing.assert_close(k[:, c, :, : lens[c] + T], s_k[:, :, : lens[c] + T], rtol=1e-4, atol=1e-4)
            assert torch.equal(logits[rows].argmax(-1), s_logits.argmax(-1)), name


@pytest.mark.gpu
@triton_only
def test_batched_ar_verify_and_dflash_draft_with_the_live_kernel_match_sdpa():
    """The AR verify (one token per slot at frontiers 21 / 9 / 30) and the DFlash draft (each slot's context rows
    and block at its own frontier, the drafter's causal / window masks through the bias) over the slotted live
    kernel equal SDPA over every slot's whole region (the twin)."""
    target, drafter = random_pair(seed=5, vocab_size=97, device=DEV)
    lens, cap = [21, 9, 30], 64
    C = len(lens)
    prompts = [(torch.arange(1, n + 1, device=DEV) * (c + 3)) % 97 for c, n in enumerate(lens)]
    start = torch.tensor(lens, device=DEV)
    cols = torch.arange(cap, device=DEV)
    g = group_size(target)
    bias = torch.stack([visible_bias((cols <= start[c])[None, :], torch.float32, g) for c in range(C)])
    bonus = torch.tensor([3, 4, 5], device=DEV)
    outs = {}
    for attention in ("live", "sdpa"):
        k, v = _prefilled(target, prompts, cap)
        logits, _ = target_forward_batch(target, bonus, start, k, v, start, bias, attention=attention)
        outs[attention] = (logits, k)
    for a, b in zip(outs["live"], outs["sdpa"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)

    Tb, Cx = drafter.block_size, 3
    dg = group_size(drafter)
    biases = [torch.stack([visible_bias(draft_visible(drafter, l, start[c], Tb, cap), torch.float32, dg)
                           for c in range(C)]) for l in range(len(drafter.layers))]
    gen = torch.Generator().manual_seed(4)
    hidden = torch.randn(C * Cx, drafter.fc.in_features, generator=gen).to(DEV)
    emb = target.embed(torch.arange(3, 3 + C * Tb, device=DEV) % 97)
    ctx_start = start - Cx
    shape = drafter.new_cache(cap).k.shape
    stale = [torch.randn(shape[0], C, *shape[1:], generator=gen).to(DEV) for _ in range(2)]   # past each frontier
    drafts = {}
    for attention in ("live", "sdpa"):
        dk, dv = (x.clone() for x in stale)
        drafts[attention] = draft_forward_batch(drafter, hidden, emb, dk, dv, ctx_start, start, biases, attention=attention)
    torch.testing.assert_close(drafts["live"], drafts["sdpa"], rtol=1e-4, atol=1e-4)


def test_the_batched_forwards_refuse_an_unknown_attention():
    target, _ = random_pair(seed=5, vocab_size=97, device="cpu")
    z = torch.zeros(1, dtype=torch.long)
    with pytest.raises(ValueError, match="attention must be one of"):
        target_forward_batch(target, z, z, None, None, z, None, attention="flash")


@pytest.mark.gpu
@triton_only
def test_two_slots_of_a_dflash_block_keep_one_slots_ranges_and_its_bits():
    """Two slots of 64-127 folded rows (a DFlash block, a small DDTree verify) split their prefix into one slot's
    ranges each (attention.split_pairs), where n_split over both slots' programs would give each half as many: so
    a batch of two sums each slot's attention in the single loop's order, bit for bit; AR's rows and 3+ slots
    keep counting programs over every slot."""
    from ddtree_bench.engine.gpu.kernels.attention import block_m, live_attend, n_split, split_pairs

    T, big_S, prefix = 32, 1280, 1100
    M = (Hq // Hkv) * T
    assert n_split(split_pairs(2, Hkv, M), M, big_S, block_m(M)) == n_split(Hkv, M, big_S, block_m(M))
    assert n_split(2 * Hkv, M, big_S, block_m(M)) < n_split(Hkv, M, big_S, block_m(M))   # the rule changes the count
    assert split_pairs(2, Hkv, 4) == 2 * Hkv and split_pairs(3, Hkv, M) == 3 * Hkv and split_pairs(1, Hkv, M) == Hkv
    g = torch.Generator().manual_seed(7)
    q = torch.randn(2, Hq, T, D, generator=g).to(DEV)
    k, v = (torch.randn(2, Hkv, big_S, D, generator=g).to(DEV) for _ in range(2))
    starts = torch.tensor([prefix, prefix - 300], device=DEV)
    vis = torch.arange(big_S, device=DEV)[None, None, :] <= (starts[:, None, None] + torch.arange(T, device=DEV)[None, :, None])
    bias = torch.zeros(2, T, big_S, device=DEV).masked_fill(~vis, float("-inf")).repeat(1, Hq // Hkv, 1)
    got = live_attend(q, k, v, bias, starts + T, starts)
    for c in range(2):
        one = live_attend(q[c], k[c], v[c], bias[c], starts[c] + T, starts[c])
        assert torch.equal(got[c * T:(c + 1) * T], one), c
    torch.testing.assert_close(got, grouped_attend_batch(q, k, v, bias), **TOL)


@pytest.mark.gpu
@triton_only
def test_the_live_kernels_tile_and_stage_knobs_keep_its_values_and_refuse_other_sizes(monkeypatch):
    """DDTREE_LIVE_BLOCK_N / DDTREE_LIVE_STAGES (an A/B's key tile width and pipeline depth for the live-slot kernel,
    benchmarks/gpu_slot_attention_ab.py --arms) give SDPA's values over two slots at their own frontiers; a width
    the kernel cannot tile is bad input."""
    from ddtree_bench.engine.gpu.kernels.attention import live_attend
    from ddtree_bench.errors import UsageError

    T = 6
    k5, v5 = _slotted(31)
    k, v = _region(k5, 2), _region(v5, 2)
    _, _, st, bias = _trees(2, T - 1, STARTS[:2], seed=31)
    q = torch.randn(2, Hq, T, D, generator=torch.Generator().manual_seed(31)).to(DEV)
    want = grouped_attend_batch(q, k, v, bias)
    for bn, stages in (("16", "1"), ("32", "3"), ("128", "2")):
        monkeypatch.setenv("DDTREE_LIVE_BLOCK_N", bn)
        monkeypatch.setenv("DDTREE_LIVE_STAGES", stages)
        torch.testing.assert_close(live_attend(q, k, v, bias, st + T, st, splits=3), want, **TOL)
    from ddtree_bench.engine.gpu.kernels.warm import record

    bf = lambda x: x.to(torch.bfloat16)  # noqa: E731 - recorded, not run: the launch bf16 gets (fp32 keeps 1 stage)
    (la,) = record(lambda: live_attend(bf(q), bf(k), bf(v), bf(bias), st + T, st, splits=1))
    assert (la.kwargs["BLOCK_N"], la.kwargs["num_stages"]) == (128, 2)
    monkeypatch.delenv("DDTREE_LIVE_BLOCK_N")
    monkeypatch.delenv("DDTREE_LIVE_STAGES")
    (la,) = record(lambda: live_attend(bf(q), bf(k), bf(v), bf(bias), st + T, st, splits=1))
    assert (la.kwargs["BLOCK_N"], la.kwargs["num_stages"]) == (64, 2)   # the defaults: BLOCK_N, STAGES
    monkeypatch.setenv("DDTREE_LIVE_STAGES", "3")
    (la,) = record(lambda: live_attend(bf(q), bf(k), bf(v), bf(bias), st + T, st, splits=1))
    assert la.kwargs["num_stages"] == 3
    monkeypatch.setenv("DDTREE_LIVE_BLOCK_N", "48")
    with pytest.raises(UsageError, match="DDTREE_LIVE_BLOCK_N"):
        live_attend(q, k, v, bias, st + T, st)
