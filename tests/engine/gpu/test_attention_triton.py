"""The live-slot attention kernel (engine/gpu/kernels/attention.py) against its twin, forward.grouped_attend
(SDPA over every cache slot): same values, every slot past the live length left unread, the
prefix shortcut, split-KV and one range, the partials cap on split ranges, every row block live_attend takes
and the wide tree tiles (WIDE_SHAPES), grouped-query groups 1/2/4, and whole target and drafter
forwards with `attention="live"` against `attention="sdpa"`. They run on CUDA, and in CI on a CPU
under Triton's interpreter (engine/gpu/test_triton_interpreter.py):
    TRITON_INTERPRET=1 python -m pytest -m gpu tests/engine/gpu/test_attention_triton.py
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from ddtree_bench.engine.gpu.forward import (StaticKV, draft_forward, draft_visible, grouped_attend, group_size,
                                             target_forward, visible_bias)
from ddtree_bench.engine.gpu.tree_ops import verify_visible
from ddtree_bench.engine.loading import random_pair

from tree_attention_support import random_tree as _random_tree
from triton_support import DEV, triton_only

DTYPES = ["float32"] + (["bfloat16"] if DEV == "cuda" else [])   # the interpreter's bf16 cast is not RNE
INTERPRETED = DEV == "cpu"   # Triton's CPU interpreter (CI): the tuning-shape tests at fewer cases, same checks


def _tol(dt):
    return dict(rtol=2e-5, atol=2e-5) if dt == torch.float32 else dict(rtol=2e-2, atol=2e-2)


def _tree_bias(T: int, start: int, S: int, group: int, dt, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    anc = ((torch.rand(T, T, generator=g) < 0.5).tril() | torch.eye(T, dtype=torch.bool)).to(DEV)
    return visible_bias(verify_visible(anc, torch.tensor(start, device=DEV), S), dt, group)


@pytest.mark.gpu
@triton_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Hq,Hkv,T,start,splits", [(4, 1, 1, 100, None), (4, 2, 5, 70, None), (4, 2, 5, 70, 1),
                                                   (2, 2, 17, 3, 3), (8, 2, 33, 60, None)])
def test_live_attend_equals_sdpa_over_every_slot_and_reads_nothing_past_live(dtype, Hq, Hkv, T, start, splits):
    """Slots past start + T hold NaN: SDPA over a clean copy is the reference; the kernel must not touch them."""
    from ddtree_bench.engine.gpu.kernels.attention import live_attend

    dt = getattr(torch, dtype)
    S, D = 192, 32
    g = torch.Generator().manual_seed(T * 7 + start)
    q, k, v = (torch.randn(*s, generator=g).to(DEV, dt) for s in ((Hq, T, D), (Hkv, S, D), (Hkv, S, D)))
    bias = _tree_bias(T, start, S, Hq // Hkv, dt, seed=T)
    want = grouped_attend(q, k, v, bias)
    live = start + T
    k[:, live:] = float("nan")
    v[:, live:] = float("nan")
    st = torch.tensor(start, device=DEV)
    for prefix in (None, st):
        for fold in (False, True):   # combine as a second launch, or folded into the one launch
            got = live_attend(q, k, v, bias, st + T, prefix, splits=splits, fold=fold)
            assert got.shape == want.shape and got.dtype == want.dtype
            torch.testing.assert_close(got.float(), want.float(), **_tol(dt))


@pytest.mark.gpu
@triton_only
def test_a_folded_launch_sets_its_counters_back_to_zero_so_the_next_launch_combines_again():
    """The one-launch combine: the last range of a row block to finish reduces the partials and resets the
    block's counter. Three launches in a row each give SDPA's result (a counter left at n would make the next
    launch's last range miss its turn and leave the output unwritten), and the counters end at zero."""
    from ddtree_bench.engine.gpu.kernels.attention import counters, live_attend
    from ddtree_bench.engine.gpu.kernels.tree_attention import Config, tree_attend

    S, D, T, start = 128, 16, 6, 40
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(*s, generator=g).to(DEV) for s in ((4, T, D), (2, S, D), (2, S, D)))
    par, dep, path = _random_tree(T - 1, 3, seed=8)
    from ddtree_bench.engine.gpu.tree_ops import ancestors

    st = torch.tensor(start, device=DEV)
    bias = visible_bias(verify_visible(ancestors(par.to(DEV), 3), st, S), torch.float32, 2)
    want = grouped_attend(q, k, v, bias)
    pos = st + torch.cat([torch.zeros(1, dtype=torch.long), dep]).to(DEV)
    for _ in range(3):
        torch.testing.assert_close(live_attend(q, k, v, bias, st + T, st, splits=3, fold=True), want,
                                   **_tol(torch.float32))
        torch.testing.assert_close(tree_attend(q, k, v, path.to(DEV), pos, st, splits=2,
                                               launch=Config(16, 16, 4, 1, tree_dense=True, fold=True)), want,
                                   **_tol(torch.float32))
    assert not counters(DEV, 1).any()


@pytest.mark.gpu
@triton_only
def test_the_prefix_shortcut_does_not_read_the_bias_over_the_prefix():
    """With `prefix`, slots < prefix count as visible whatever the bias says there (the contract the target's
    verify meets); without it the bias is read everywhere."""
    from ddtree_bench.engine.gpu.kernels.attention import live_attend

    S, D, T, start = 128, 16, 4, 50
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(*s, generator=g).to(DEV) for s in ((2, T, D), (1, S, D), (1, S, D)))
    bias = _tree_bias(T, start, S, 2, torch.float32, seed=2)
    hidden_prefix = bias.clone()
    hidden_prefix[:, :start] = float("-inf")
    hidden_prefix[:, 0] = 0.0
    st = torch.tensor(start, device=DEV)
    torch.testing.assert_close(live_attend(q, k, v, hidden_prefix, st + T, st), grouped_attend(q, k, v, bias), **_tol(torch.float32))
    torch.testing.assert_close(live_attend(q, k, v, hidden_prefix, st + T, None), grouped_attend(q, k, v, hidden_prefix),
                               **_tol(torch.float32))


def _nan_empty(monkeypatch):
    """torch.empty fills float tensors with NaN from here on (the test's scope): a kernel that reads a partial it
    never stored then gives NaN instead of whatever the allocator left there."""
    real = torch.empty

    def empty(*a, **kw):
        out = real(*a, **kw)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch, "empty", empty)


@pytest.mark.gpu
@triton_only
def test_the_partials_cap_keeps_ar_and_caps_ranges_whose_partials_outweigh_the_kv(monkeypatch):
    """n_split's count on the 8B shape (8 KV heads, 2048-slot cache, 1024-token prefix) and the ranges the kernel
    then uses at the live length: AR (M = 4 rows) keeps every range, since its partials are a few KB; wherever
    ranges x M exceeds the live slots (fp32 partials heavier than the bf16 K/V they summarise) the cap takes
    ranges off, and never below one."""
    from ddtree_bench.engine.gpu.kernels import experimental
    from ddtree_bench.engine.gpu.kernels.attention import n_split, ranges_used

    prefix, S, Hkv = 1024, 2048, 8
    monkeypatch.delenv(experimental.ENV, raising=False)
    assert ranges_used(n_split(Hkv, 256, S), 256, prefix + 64) == n_split(Hkv, 256, S) == 5   # off by default
    monkeypatch.setenv(experimental.ENV, "split-cap")
    for n in (1, 16, 64, 128, 192):
        M, live = 4 * n, prefix + n
        ns = n_split(Hkv, M, S)
        r = ranges_used(ns, M, live)
        assert 1 <= r <= ns
        assert r * M <= live or r == 1                     # partial bytes <= bf16 K/V bytes
        assert r == ns or (r + 1) * M > live               # only as many ranges taken off as the cap needs
        if n == 1:
            assert r == ns > 1
        if n == 64:
            assert ns * M > live and r < ns                # the launch profiled at 0.29 ms of combine per forward


@pytest.mark.gpu
@triton_only
@pytest.mark.parametrize("start", [20, 80, 150])
def test_a_capped_launch_uses_only_its_first_ranges_and_still_equals_sdpa(monkeypatch, start):
    """M = 40 folded rows, three ranges chosen by n_split: the live length caps them at 1, 2 and 3 (start 20, 80,
    150). Every uninitialised buffer holds NaN, so a combine (second launch or folded) that read a range the
    capped launch left unstored would give NaN; slots past live hold NaN too."""
    from ddtree_bench.engine.gpu.kernels import experimental
    from ddtree_bench.engine.gpu.kernels.attention import n_split, ranges_used, live_attend

    monkeypatch.setenv(experimental.ENV, "split-cap")
    Hq, Hkv, T, S, D = 8, 2, 10, 192, 32
    M = Hq // Hkv * T
    assert n_split(Hkv, M, S) == 3 and ranges_used(3, M, start + T) == {20: 1, 80: 2, 150: 3}[start]
    g = torch.Generator().manual_seed(start)
    q, k, v = (torch.randn(*s, generator=g).to(DEV) for s in ((Hq, T, D), (Hkv, S, D), (Hkv, S, D)))
    bias = _tree_bias(T, start, S, Hq // Hkv, torch.float32, seed=start)
    want = grouped_attend(q, k, v, bias)
    k[:, start + T:] = float("nan")
    v[:, start + T:] = float("nan")
    st = torch.tensor(start, device=DEV)
    _nan_empty(monkeypatch)
    for prefix in (None, st):
        for fold in (False, True):
            torch.testing.assert_close(live_attend(q, k, v, bias, st + T, prefix, fold=fold), want,
                                       **_tol(torch.float32))


@pytest.mark.gpu
@triton_only
@pytest.mark.parametrize("T,start", [(37, 5), (70, 40)] + ([] if INTERPRETED else [(37, 90)]))
def test_live_attend_at_every_row_block_it_takes_equals_sdpa(T, start):
    """The tuner's explicit row blocks (16 .. 128 rows per program, 8 warps at 128) on ragged row counts
    (M = 74, 140: no block divides them), with the chosen ranges and with fixed ones, prefix shortcut on and off;
    a row block live_attend does not take is refused."""
    from ddtree_bench.engine.gpu.kernels.attention import BLOCK_MS, live_attend

    Hq, Hkv, S, D = 4, 2, 192, 32
    g = torch.Generator().manual_seed(T + start)
    q, k, v = (torch.randn(*s, generator=g).to(DEV) for s in ((Hq, T, D), (Hkv, S, D), (Hkv, S, D)))
    bias = _tree_bias(T, start, S, Hq // Hkv, torch.float32, seed=start)
    want = grouped_attend(q, k, v, bias)
    st = torch.tensor(start, device=DEV)
    # the interpreter (CI) takes the small blocks on the first case only (M = 74); M = 140 is there for the blocks it spans
    for rows in [r for r in BLOCK_MS if not (INTERPRETED and T > 64 and r < 64)]:
        for splits, prefix in ((None, st), (2, None)) if INTERPRETED else ((None, st), (2, st), (None, None)):
            got = live_attend(q, k, v, bias, st + T, prefix, splits=splits, rows=rows)
            torch.testing.assert_close(got, want, **_tol(torch.float32))
    with pytest.raises(ValueError, match="query rows per program"):
        live_attend(q, k, v, bias, st + T, st, rows=48)


@pytest.mark.gpu
@triton_only
def test_target_and_draft_forwards_with_live_attention_match_sdpa():
    """Whole forwards on a random Qwen3 pair (PyTorch layer ops; only the attention differs): logits, hidden
    states and the cache writes agree; the drafter's causal/window masks go through the bias."""
    target, drafter = random_pair(seed=5, vocab_size=97, device=DEV)
    P, T, cap = 30, 9, 128
    prompt = torch.arange(1, P + 1, device=DEV) % 97
    ids = torch.arange(40, 40 + T, device=DEV)
    pos = P + torch.arange(T, device=DEV)
    anc = torch.ones(T, T, dtype=torch.bool, device=DEV).tril()
    start = torch.tensor(P, device=DEV)
    outs = []
    for attention in ("live", "sdpa"):
        cache = target.new_cache(cap)
        target(prompt, torch.arange(P, device=DEV), cache, 0)
        bias = visible_bias(verify_visible(anc, start, cap), torch.float32, group_size(target))
        logits, hidden = target_forward(target, ids, pos, StaticKV(cache), start, bias, (0, 1), attention=attention)
        dcache = drafter.new_cache(cap)
        Tb = drafter.block_size
        biases = [visible_bias(draft_visible(drafter, i, start, Tb, cap), torch.float32, group_size(drafter))
                  for i in range(len(drafter.layers))]
        emb = target.embed(torch.arange(3, 3 + Tb, device=DEV))
        h = draft_forward(drafter, hidden[:P % 7 + 4], emb, StaticKV(dcache), start - 4, start, biases, attention=attention)
        outs.append((logits, hidden, h, cache.k[:, :, : P + T]))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert torch.equal(outs[0][0].argmax(-1), outs[1][0].argmax(-1))


@pytest.mark.gpu
@triton_only
def test_auto_takes_the_kernel_up_to_its_row_limit_and_sdpa_above():
    """forward's auto attention: the live-slot kernel up to AUTO_MAX_ROWS folded query rows (g*T), SDPA above
    (where SDPA's fused kernel measured faster on an H200)."""
    from ddtree_bench.engine.gpu.kernels.attention import AUTO_MAX_ROWS, wanted

    k = torch.empty(8, 64, 16, device=DEV)
    assert wanted(torch.empty(32, AUTO_MAX_ROWS // 4, 16, device=DEV), k)
    assert not wanted(torch.empty(32, AUTO_MAX_ROWS // 4 + 1, 16, device=DEV), k)
    assert wanted(torch.empty(8, AUTO_MAX_ROWS, 16, device=DEV), k)   # no grouping: rows = T


@pytest.mark.gpu
@triton_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Hq,Hkv,N,start,splits,L", [(4, 1, 0, 100, None, 5), (4, 2, 6, 70, None, 5),
                                                     (4, 2, 6, 70, 1, 5), (2, 2, 20, 3, 3, 5), (8, 2, 40, 60, 2, 5),
                                                     (4, 1, 130, 64, 1, 5), (4, 2, 40, 50, 2, 15), (2, 1, 70, 30, 1, 15)])
def test_tree_attend_equals_sdpa_with_the_trees_bias_and_reads_only_prefix_and_ancestors(dtype, Hq, Hkv, N, start, splits,
                                                                                          L):
    """Against SDPA over every slot with the ancestor bias (its twin): same values, with every slot past the
    tree holding NaN (never read), for the gathered tree phase and the dense one (combine after the launch or
    folded into it); N = 0 is a lone root, N = 130 a tree wider than one row block, L = 15 deep trees (mostly
    chains: each node's parent is the node before it four times in five)."""
    from dataclasses import replace

    from ddtree_bench.engine.gpu.kernels.tree_attention import config, tree_attend
    from ddtree_bench.engine.gpu.tree_ops import ancestors

    dt = getattr(torch, dtype)
    S, D = 256, 32
    par, dep, path = _random_tree(N, L, seed=N + start, chain=0.8 if L > 5 else 0.0)
    if L > 5:
        assert int(dep.max()) == L   # the deep case reaches the deepest depth the path table holds
    T = N + 1
    g = torch.Generator().manual_seed(T * 7 + start)
    q, k, v = (torch.randn(*s, generator=g).to(DEV, dt) for s in ((Hq, T, D), (Hkv, S, D), (Hkv, S, D)))
    st = torch.tensor(start, device=DEV)
    anc = ancestors(par.to(DEV), L)
    want = grouped_attend(q, k, v, visible_bias(verify_visible(anc, st, S), dt, Hq // Hkv))
    k[:, start + T:] = float("nan")
    v[:, start + T:] = float("nan")
    pos = st + torch.cat([torch.zeros(1, dtype=torch.long), dep]).to(DEV)
    base = config(Hq // Hkv * T, dt, DEV)
    for launch in (None, replace(base, tree_dense=True), replace(base, block_n=16, tree_dense=True, fold=True)):
        got = tree_attend(q, k, v, path.to(DEV), pos, st, splits=splits, launch=launch)
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got.float(), want.float(), **_tol(dt))


@dataclass
class _TreeCase:
    """A DDTree-shaped attention case: the PyTorch builder's tree (parents `par`, depths `dep`) compiled at `start`
    as the fast loop compiles it (path table, positions, bias), and random q, k, v."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    path: torch.Tensor
    pos: torch.Tensor
    start: torch.Tensor
    bias: torch.Tensor
    par: torch.Tensor
    dep: torch.Tensor

    def want(self) -> torch.Tensor:
        return grouped_attend(self.q, self.k, self.v, self.bias)


def _built_tree(L: int, V: int, B: int, S: int, D: int, start: int, seed: int, scale: float = 3.0, Hq: int = 4,
                Hkv: int = 2) -> _TreeCase:
    """B nodes from random draft logits (x scale: 3 wide, 12 deep), an S-slot cache, q [Hq, B+1, D], k, v [Hkv, S, D]."""
    from ddtree_bench.engine.gpu.kernels.tree_verify import compile_tree
    from ddtree_bench.engine.tree_vector import StaticTreeBuilder

    logits = torch.randn(L, V, generator=torch.Generator().manual_seed(seed)).to(DEV) * scale
    tok, par, dep = StaticTreeBuilder(L, V, B, DEV)(logits)
    st = torch.tensor(start, device=DEV)
    _, pos, _, bias, path = compile_tree(torch.ones(1, dtype=torch.long, device=DEV), tok, par, dep, st, S,
                                         torch.float32, Hq // Hkv, L)
    g = torch.Generator().manual_seed(seed + 1)
    q, k, v = (torch.randn(*s, generator=g).to(DEV) for s in ((Hq, B + 1, D), (Hkv, S, D), (Hkv, S, D)))
    return _TreeCase(q, k, v, path, pos, st, bias, par, dep)


@pytest.mark.gpu
@triton_only
def test_tree_attend_on_a_built_tree_with_the_fused_compiles_path():
    """The path table the fast loop hands over (kernels/tree_verify.compile_tree, from the PyTorch builder's
    tree of random draft logits) gives SDPA's result with compile_tree's own bias."""
    from ddtree_bench.engine.gpu.kernels.tree_attention import Config, tree_attend

    c = _built_tree(L=4, V=50, B=12, S=64, D=16, start=37, seed=3)
    q, k, v, path, pos, st, want = c.q, c.k, c.v, c.path, c.pos, c.start, c.want()
    torch.testing.assert_close(tree_attend(q, k, v, path, pos, st), want, **_tol(torch.float32))
    for k_rows in (False, True):   # both K tile layouts, split and not, gathered and dense tree phase
        for splits in (1, 2):
            for dense, fold in ((False, False), (True, False), (True, True)):
                got = tree_attend(q, k, v, path, pos, st, splits=splits, launch=Config(16, 16, 4, 1, k_rows, dense, fold))
                torch.testing.assert_close(got, want, **_tol(torch.float32))


@pytest.mark.gpu
@triton_only
def test_config_bands_name_their_prefix_ranges_and_the_launch_uses_them():
    """config()'s bands (the H200 tuning's and A/B's winners): dense 64-row tiles over eight prefix ranges below 128
    folded rows (one slot's small trees), four below 384 and two up to 768, 64 x 64 tiles over one range up to 1536 (64 x 128 until B = 256's 257 nodes showed
    them a second wave of programs), dense 64-row tiles with n_split's count above. A launch with the default shape
    gives the bits of the same shape launched with those ranges as `splits` (so the ranges are the ones used, not
    n_split's 16 here), clamped to one range per block_n slots of the cache, and SDPA's values."""
    from ddtree_bench.engine.gpu.kernels.attention import n_split
    from ddtree_bench.engine.gpu.kernels.tree_attention import config, tree_attend

    assert [(c.block_m, c.block_n, c.tree_dense, c.ranges) for c in map(lambda M: config(M, torch.bfloat16),
            (4, 127, 128, 383, 384, 768, 769, 1536, 1537))] == ([(64, 64, True, 8)] * 2 + [(64, 64, True, 4)] * 2
                                                                  + [(64, 64, True, 2)] * 2 + [(64, 64, True, 1)] * 2
                                                                  + [(64, 64, True, None)])
    assert config(256, torch.float32).stages == 1 and config(256, torch.bfloat16).stages == 2
    B, Hq, Hkv = 20, 4, 2
    for S in (1024, 128):   # 16 slot tiles, 14 of them prefix: 8 ranges (42 folded rows); 2 tiles: 2 ranges
        t = _built_tree(L=4, V=50, B=B, S=S, D=16, start=min(900, S - B - 1), seed=5, Hq=Hq, Hkv=Hkv)
        c = config(Hq // Hkv * (B + 1), torch.float32, DEV)   # the card's own shape, as tree_attend takes it
        if S == 1024:   # n_split would take one range per slot tile (16 of 64 slots; 32 of an H100's 32)
            assert n_split(Hkv, Hq // Hkv * (B + 1), S, c.block_m, c.block_n) == S // c.block_n
        got = tree_attend(t.q, t.k, t.v, t.path, t.pos, t.start)
        assert torch.equal(got, tree_attend(t.q, t.k, t.v, t.path, t.pos, t.start, splits=min(c.ranges, S // c.block_n),
                                            launch=c))
        torch.testing.assert_close(got, t.want(), **_tol(torch.float32))


@pytest.mark.gpu
@triton_only
@pytest.mark.parametrize("scale", [3.0, 12.0])
def test_built_trees_put_every_parent_before_its_child_and_the_dense_phase_matches_on_deep_ones(scale):
    """The dense tree phase (and the live kernel's prefix shortcut) stop a row block at its last row's node, which
    is right only if every ancestor comes first in the tree's order: on the builder's trees, wide (logits x 3) and
    deep (x 12, depth up to L = 15), each node's parent index is below its own and compile_tree's path table lists
    ancestors of lower index; tree_attend's dense phase on the deep tree gives compile_tree's-bias SDPA result."""
    from ddtree_bench.engine.gpu.kernels.tree_attention import Config, tree_attend

    B, start = 40, 20
    c = _built_tree(L=15, V=40, B=B, S=128, D=16, start=start, seed=11, scale=scale)
    q, k, v, path, pos, st, par, dep = c.q, c.k, c.v, c.path, c.pos, c.start, c.par, c.dep
    nodes = torch.arange(1, B + 1, device=DEV)
    assert bool((par < nodes).all())   # parents 1-based, root 0
    depth = (pos - start).cpu()
    for t in range(B + 1):
        on_path = path[t, : int(depth[t]) + 1].cpu()
        assert bool((on_path[:-1] < on_path[1:]).all()) and int(on_path[-1]) == t
    if scale > 3.0:
        assert int(dep.max()) >= 10   # a deep tree: what the dense phase is for
    want = c.want()
    for splits in (1, 2):
        got = tree_attend(q, k, v, path, pos, st, splits=splits, launch=Config(16, 16, 4, 1, tree_dense=True))
        torch.testing.assert_close(got, want, **_tol(torch.float32))


@pytest.mark.gpu
@triton_only
def test_target_forward_with_tree_attention_matches_sdpa_and_auto_takes_it_for_a_tree(monkeypatch):
    """A whole verify forward on a random Qwen3 target over a built tree: attention="tree" (path table, bias
    unread) gives SDPA's logits and hidden states; auto with the fused ops takes the tree kernel when the path
    comes along and the tree has TREE_MIN_ROWS folded rows (same result), the live kernel one row short of
    that or without the path."""
    from ddtree_bench.engine.gpu.fused import TritonOps
    from ddtree_bench.engine.gpu.kernels.tree_verify import compile_tree
    from ddtree_bench.engine.tree_vector import StaticTreeBuilder

    target, _ = random_pair(seed=6, vocab_size=97, device=DEV)
    P, L, B, cap = 21, 4, 10, 64
    logits = torch.randn(L, 97, generator=torch.Generator().manual_seed(9)).to(DEV) * 3
    tok, par, dep = StaticTreeBuilder(L, 97, B, DEV)(logits)
    start = torch.tensor(P, device=DEV)
    ids, pos, anc, bias, path = compile_tree(torch.ones(1, dtype=torch.long, device=DEV), tok, par, dep, start, cap,
                                             torch.float32, group_size(target), L)
    prompt = torch.arange(1, P + 1, device=DEV) % 97
    from ddtree_bench.engine.gpu import forward
    from ddtree_bench.engine.gpu.kernels import tree_attention

    calls, real = [], tree_attention.tree_attend
    monkeypatch.setattr(forward.tree_kernel, "tree_attend", lambda *a, **k: calls.append(1) or real(*a, **k))
    rows = group_size(target) * (B + 1)
    monkeypatch.setattr(tree_attention, "TREE_MIN_ROWS", rows)   # this tree is exactly big enough for auto
    outs, ran = {}, {}
    triton_ops = TritonOps()   # what ops_for gives on CUDA; here the same kernels under the interpreter
    for name, attention, tree_path, ops in (("sdpa", "sdpa", None, None), ("tree", "tree", path, None),
                                            ("auto", "auto", path, triton_ops), ("auto-no-path", "auto", None, triton_ops)):
        cache = target.new_cache(cap)
        target(prompt, torch.arange(P, device=DEV), cache, 0)
        calls.clear()
        outs[name] = target_forward(target, ids, pos, StaticKV(cache), start, bias, (0, 1), attention=attention,
                                    tree_path=tree_path, ops=ops)
        ran[name] = len(calls)
    assert ran == {"sdpa": 0, "tree": len(target.model.layers), "auto": len(target.model.layers), "auto-no-path": 0}
    monkeypatch.setattr(tree_attention, "TREE_MIN_ROWS", rows + 1)   # one row short: auto takes the live kernel
    cache = target.new_cache(cap)
    target(prompt, torch.arange(P, device=DEV), cache, 0)
    calls.clear()
    small = target_forward(target, ids, pos, StaticKV(cache), start, bias, (0, 1), tree_path=path, ops=triton_ops)
    assert not calls
    torch.testing.assert_close(small[0], outs["sdpa"][0], rtol=1e-4, atol=1e-4)
    for name in ("tree", "auto", "auto-no-path"):
        for a, b in zip(outs[name], outs["sdpa"]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@triton_only
def test_tree_attend_refuses_a_head_dim_it_cannot_tile_and_auto_does_not_pick_it():
    """Head dims that are not a power of two >= 16 (some models use 80 or 96): a clear error from the kernel's
    entry, and auto's rule leaves them to the live-slot kernel."""
    from ddtree_bench.engine.gpu.kernels.tree_attention import TREE_MIN_ROWS, tree_attend, wanted

    q = torch.zeros(4, TREE_MIN_ROWS, 80, device=DEV)
    k = torch.zeros(1, 600, 80, device=DEV)
    assert not wanted(q, k) and wanted(torch.zeros(4, TREE_MIN_ROWS // 4, 64, device=DEV), k[..., :64])
    with pytest.raises(ValueError, match="power-of-two head dim"):
        tree_attend(q, k, k, torch.zeros(TREE_MIN_ROWS, 16, dtype=torch.long, device=DEV),
                    torch.zeros(TREE_MIN_ROWS, dtype=torch.long, device=DEV), torch.tensor(0, device=DEV))


@pytest.mark.gpu
@triton_only
@pytest.mark.parametrize("tile", [0, 1, 2, 3], ids=["64x64", "128x64", "64x128", "64x32"])   # xdist spreads them
@pytest.mark.parametrize("N,start,L,Hq", [(40, 3, 5, 4), (70, 100, 15, 4)] + ([] if INTERPRETED else [(130, 64, 5, 8)]))
def test_the_wide_tree_tiles_equal_sdpa_split_or_not_gathered_or_dense(N, start, L, Hq, tile):
    """Each of WIDE_SHAPES (64/128-row tiles, the ones that can reach Hopper's wgmma; a test each) and 32-wide key tiles
    in three stages (NARROW_TILES: the H100's lower bands, "narrow-tiles" elsewhere: docs/gpu-performance.md) against
    SDPA with the tree's bias: ragged row counts (M = 82, 524, 142 at 2 KV heads), prefixes from 3 slots (a lone masked tail tile) to
    100, deep chains (L = 15), the prefix in one range and in three, gathered and dense tree phase, combine after
    or folded; slots past the tree hold NaN."""
    from dataclasses import replace

    from ddtree_bench.engine.gpu.kernels.tree_attention import NARROW_TILES, WIDE_SHAPES, Config, tree_attend
    from ddtree_bench.engine.gpu.tree_ops import ancestors

    Hkv, S, D = 2, 256, 32
    par, dep, path = _random_tree(N, L, seed=N + start, chain=0.8 if L > 5 else 0.0)
    T = N + 1
    g = torch.Generator().manual_seed(T + start)
    q, k, v = (torch.randn(*s, generator=g).to(DEV) for s in ((Hq, T, D), (Hkv, S, D), (Hkv, S, D)))
    st = torch.tensor(start, device=DEV)
    want = grouped_attend(q, k, v, visible_bias(verify_visible(ancestors(par.to(DEV), L), st, S), torch.float32,
                                                Hq // Hkv))
    k[:, start + T:] = float("nan")
    v[:, start + T:] = float("nan")
    pos = st + torch.cat([torch.zeros(1, dtype=torch.long), dep]).to(DEV)
    c = WIDE_SHAPES[tile] if tile < 3 else Config(64, NARROW_TILES[0], 4, NARROW_TILES[1])
    assert (c.block_m, c.block_n) == [(64, 64), (128, 64), (64, 128), (64, 32)][tile] and len(WIDE_SHAPES) == 3   # ids
    for splits, dense, fold in ((1, False, False), (1, True, False), (3, False, False), (3, True, True)):
        got = tree_attend(q, k, v, path.to(DEV), pos, st, splits=splits,
                          launch=replace(c, stages=1, tree_dense=dense, fold=fold))
        torch.testing.assert_close(got, want, **_tol(torch.float32))


@pytest.mark.gpu
@triton_only
@pytest.mark.parametrize("N,L", [(0, 3), (40, 3), (63, 3), (64, 3), (130, 3), (70, 15)])
def test_visibility_words_are_the_ancestor_matrix_and_give_the_path_tests_bits(N, L):
    """vis_words sets bit j of row t exactly where node j is t's ancestor or t itself (tree_ops.ancestors), across
    word edges (T = 64, 65, 131); the dense tree phase reading them gives the path-table test's bits, at tiles of 16
    (a word's quarter), 64 and 128 nodes (two words), one range or three, combine after or folded, and through
    forward's TreeRows (made once, reused); 32-node tiles (half a word: DDTREE_TREE_BLOCK_N=32) too."""
    from dataclasses import replace

    from ddtree_bench.engine.gpu.kernels.tree_attention import Config, TreeRows, tree_attend, vis_words
    from ddtree_bench.engine.gpu.tree_ops import ancestors

    Hq, Hkv, S, D, start = 4, 2, 320, 16, 100
    par, dep, path = _random_tree(N, L, seed=N + 3, chain=0.8 if L > 5 else 0.0)
    T = N + 1
    st = torch.tensor(start, device=DEV)
    pos = st + torch.cat([torch.zeros(1, dtype=torch.long), dep]).to(DEV)
    words = vis_words(path.to(DEV), pos, st)
    assert words.shape == (1, T, -(-T // 64)) and words.dtype == torch.long
    bits = torch.arange(64, device=DEV)
    unpacked = ((words[0, :, :, None] >> bits) & 1).bool().reshape(T, -1)[:, :T]
    assert torch.equal(unpacked, ancestors(par.to(DEV), L))
    g = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(*s, generator=g).to(DEV) for s in ((Hq, T, D), (Hkv, S, D), (Hkv, S, D)))
    launches = [Config(16, 16, 4, 1, tree_dense=True), Config(16, 64, 4, 1, tree_dense=True),
                Config(16, 128, 4, 1, tree_dense=True, fold=True), Config(16, 32, 4, 1, tree_dense=True)]
    rows = TreeRows(path.to(DEV), pos)
    assert rows.words(st) is rows.words(st) and torch.equal(rows.words(st), words)
    cases = [(c, s) for c in launches for s in (1, 3)]
    if INTERPRETED:   # the interpreter's budget: each word edge once (a quarter word at T = 65, two words at T = 131)
        cases = {64: [(launches[0], 3), (launches[1], 1)], 130: [(launches[2], 1), (launches[2], 3)],
                 40: [(launches[3], 3)]}.get(N, [(launches[1], 3)])
    for launch, splits in cases:
        plain = tree_attend(q, k, v, path.to(DEV), pos, st, splits=splits, launch=launch)
        assert torch.equal(tree_attend(q, k, v, path.to(DEV), pos, st, splits=splits, launch=launch, words=words),
                           plain), (launch, splits)
    with pytest.raises(ValueError, match="vis_words"):
        tree_attend(q, k, v, path.to(DEV), pos, st, launch=replace(launches[1], stages=1), words=words[..., :0])


@pytest.mark.gpu
@triton_only
def test_the_wide_tree_tiles_on_a_built_tree_match_compile_trees_bias():
    """WIDE_SHAPES on the builder's tree (compile_tree's path table and bias), split over the prefix as n_split
    chooses and in two ranges, gathered and dense."""
    from dataclasses import replace

    from ddtree_bench.engine.gpu.kernels.tree_attention import WIDE_SHAPES, tree_attend

    t = _built_tree(L=6, V=50, B=45, S=192, D=16, start=70, seed=21)
    q, k, v, path, pos, st, want = t.q, t.k, t.v, t.path, t.pos, t.start, t.want()
    for c in WIDE_SHAPES:
        for splits, dense in ((None, False), (2, True)) if INTERPRETED else ((None, False), (None, True), (2, False), (2, True)):
            got = tree_attend(q, k, v, path, pos, st, splits=splits, launch=replace(c, stages=1, tree_dense=dense))
            torch.testing.assert_close(got, want, **_tol(torch.float32))


@pytest.mark.gpu
@triton_only
@pytest.mark.parametrize("rows_from", ["1", "100000"])
def test_the_combine_over_16_rows_per_program_equals_sdpa_live_and_tree(monkeypatch, rows_from):
    """The split-KV combine at 16 query rows per program (DDTREE_COMBINE_ROWS_FROM=1 takes it at any M) and at one,
    on row counts that are not a multiple of 16 (the last block masked), g-major (live) and t-major (tree) rows:
    the same values as SDPA each time."""
    from ddtree_bench.engine.gpu.kernels import attention
    from ddtree_bench.engine.gpu.kernels.tree_attention import tree_attend

    monkeypatch.setenv("DDTREE_COMBINE_ROWS_FROM", rows_from)
    assert attention.combine_rows(42) == (16 if rows_from == "1" else 1)
    case = _built_tree(L=5, V=64, B=20, S=128, D=32, start=30, seed=5)   # M = 2 * 21 = 42 folded rows
    got = tree_attend(case.q, case.k, case.v, case.path, case.pos, case.start, splits=3)
    torch.testing.assert_close(got, case.want(), **_tol(torch.float32))
    Hq, Hkv, T, start, S, D = 4, 2, 11, 40, 128, 32   # M = 22
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(*s, generator=g).to(DEV) for s in ((Hq, T, D), (Hkv, S, D), (Hkv, S, D)))
    bias = _tree_bias(T, start, S, Hq // Hkv, torch.float32, seed=3)
    want = grouped_attend(q, k, v, bias)
    st = torch.tensor(start, device=DEV)
    got = attention.live_attend(q, k, v, bias, st + T, st, splits=4, fold=False)
    torch.testing.assert_close(got, want, **_tol(torch.float32))


def test_the_combine_takes_16_rows_from_its_edge_and_the_knob_is_checked(monkeypatch):
    from ddtree_bench.engine.gpu.kernels import attention
    from ddtree_bench.errors import UsageError

    monkeypatch.delenv("DDTREE_COMBINE_ROWS_FROM", raising=False)
    edge = attention.COMBINE_ROWS_FROM
    assert attention.combine_rows(edge - 1) == 1 and attention.combine_rows(edge) == attention.COMBINE_ROWS == 16
    monkeypatch.setenv("DDTREE_COMBINE_ROWS_FROM", "0")
    with pytest.raises(UsageError):
        attention.combine_rows(500)


@pytest.mark.gpu
@triton_only
@pytest.mark.parametrize("dtype", ["float16"] + (["bfloat16"] if DEV == "cuda" else []))   # fp16 casts RNE interpreted
def test_split_partials_in_the_activation_dtype_still_equal_sdpa_live_and_tree(monkeypatch, dtype):
    """"bf16-partials": the split ranges store their acc partials in the activation dtype and the combine (second
    launch or folded) still sums them in fp32: live and tree kernels within the half-precision tolerance of SDPA on
    the same inputs, as with fp32 partials."""
    from dataclasses import replace

    from ddtree_bench.engine.gpu.kernels import attention
    from ddtree_bench.engine.gpu.kernels.tree_attention import config, tree_attend

    monkeypatch.setenv("DDTREE_GPU_EXPERIMENTAL", "bf16-partials")
    dt = getattr(torch, dtype)
    assert attention.partial_dtype(dt) == dt
    Hq, Hkv, T, start, S, D = 4, 2, 11, 40, 128, 32
    g = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(*s, generator=g).to(DEV, dt) for s in ((Hq, T, D), (Hkv, S, D), (Hkv, S, D)))
    bias = _tree_bias(T, start, S, Hq // Hkv, dt, seed=4)
    want = grouped_attend(q, k, v, bias)
    st = torch.tensor(start, device=DEV)
    for fold in (False, True):
        got = attention.live_attend(q, k, v, bias, st + T, st, splits=3, fold=fold)
        assert got.dtype == dt
        torch.testing.assert_close(got.float(), want.float(), **_tol(dt))
    case = _built_tree(L=5, V=64, B=20, S=128, D=32, start=30, seed=6)
    q, k, v = (t.to(dt) for t in (case.q, case.k, case.v))
    want = grouped_attend(q, k, v, case.bias.to(dt))
    base = config(2 * 21, dt, DEV)
    for launch in (None, replace(base, fold=True)):
        got = tree_attend(q, k, v, case.path, case.pos, case.start, splits=3, launch=launch)
        torch.testing.assert_close(got.float(), want.float(), **_tol(dt))
