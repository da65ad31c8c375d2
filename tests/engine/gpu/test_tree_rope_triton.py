"""The tree kernel reading the q/k/v GEMM's raw output (kernels/tree_attention.RawQKV, the `tree-rope` feature) against
its twin: the PyTorch q/k norm + RoPE and K/V write (ops.TorchOps.qkv_rope_slots) followed by SDPA over the tree's
bias (forward.grouped_attend). The same attention output, and the cache afterwards holding the same K and V in every
slot (the tree's written, the rest untouched); one slot and several, with and without q/k norms, split or not; whole
target forwards with the feature on equal them with it off. They run on CUDA, and in CI on a CPU under Triton's
interpreter:
    TRITON_INTERPRET=1 python -m pytest -m gpu tests/engine/gpu/test_tree_rope_triton.py
"""

from __future__ import annotations

import pytest
import torch

from ddtree_bench.engine.gpu.forward import grouped_attend, visible_bias
from ddtree_bench.engine.gpu.ops import TorchOps
from ddtree_bench.engine.gpu.tree_ops import ancestors, verify_visible

from tree_attention_support import random_tree
from triton_support import DEV, triton_only

TOL = dict(rtol=2e-5, atol=2e-5)
Hq, Hkv, D, S, L = 4, 2, 16, 128, 4


def _rotary(pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, D] at positions pos (the half-split layout apply_rope takes)."""
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, device=DEV, dtype=torch.float32) / D))
    ang = pos.float()[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos(), emb.sin()


def _case(C: int, N: int, starts: list[int], seed: int, norm: bool):
    """C random trees of 1 + N nodes at prefixes `starts`, caches k, v [C, Hkv, S, D], raw q/k/v and its norms."""
    from ddtree_bench.engine.gpu.kernels.tree_attention import RawQKV

    g = torch.Generator().manual_seed(seed)
    paths, pos, bias = [], [], []
    for c in range(C):
        par, dep, path = random_tree(N, L, seed=seed + 17 * c)
        st = torch.tensor(starts[c], device=DEV)
        paths.append(path.to(DEV))
        pos.append(st + torch.cat([torch.zeros(1, dtype=torch.long), dep]).to(DEV))
        bias.append(visible_bias(verify_visible(ancestors(par.to(DEV), L), st, S), torch.float32, Hq // Hkv))
    T = N + 1
    pos = torch.cat(pos)
    cos, sin = _rotary(pos)
    k, v = (torch.randn(C, Hkv, S, D, generator=g).to(DEV) for _ in range(2))
    qkv = torch.randn(C * T, (Hq + 2 * Hkv) * D, generator=g).to(DEV)
    q_w, k_w = ((1 + 0.3 * torch.randn(D, generator=g)).to(DEV) for _ in range(2)) if norm else (None, None)
    raw = RawQKV(qkv, Hq, Hkv, q_w, k_w, 1e-6, cos, sin)
    return raw, k, v, torch.stack(paths), pos, torch.tensor(starts, device=DEV), torch.stack(bias)


def _twin(raw, k, v, prefix, bias, T: int):
    """qkv_rope_slots (the PyTorch twin) into copies of k, v, then SDPA: (output, k, v after)."""
    k, v = k.clone(), v.clone()
    q = TorchOps().qkv_rope_slots(raw.qkv, raw.n_q, raw.n_kv, raw.q_w, raw.k_w, raw.eps, raw.cos, raw.sin, k, v,
                                  prefix, T)
    return grouped_attend(q, k, v, bias), k, v


@pytest.mark.gpu
@triton_only
@pytest.mark.parametrize("C", [1, 3])
@pytest.mark.parametrize("norm", [True, False], ids=["qk-norm", "no-norm"])
def test_raw_qkv_gives_the_twins_attention_and_writes_the_twins_kv(C, norm):
    """Against qkv_rope_slots + SDPA: the output, and K / V in every slot of every region after the call (the tree's
    slots written with the normed, rotated keys and the values; the prefix and the slots past the tree untouched),
    over one range and split (the tree program then runs beside the prefix ranges), with the default launch too."""
    from ddtree_bench.engine.gpu.kernels.tree_attention import Config, tree_attend, vis_words

    N = 20
    raw, k, v, path, pos, prefix, bias = _case(C, N, [37, 5, 90][:C], seed=3 + C, norm=norm)
    want, k_want, v_want = _twin(raw, k, v, prefix, bias, N + 1)
    words = vis_words(path, pos, prefix)
    one = (lambda x: x[0]) if C == 1 else (lambda x: x)   # one slot: the call without the slot axis
    for launch, splits in ((Config(16, 16, 4, 1, tree_dense=True), 1), (Config(16, 16, 4, 1, tree_dense=True), 3),
                           (Config(32, 64, 4, 1, tree_dense=True), 2), (None, None)):
        kg, vg = k.clone(), v.clone()
        got = tree_attend(None, one(kg), one(vg), one(path), pos, one(prefix) if C == 1 else prefix, splits=splits,
                          launch=launch, words=words, raw=raw)
        torch.testing.assert_close(got, want, **TOL)
        torch.testing.assert_close(kg, k_want, **TOL)
        assert torch.equal(vg, v_want)


@pytest.mark.gpu
@triton_only
def test_raw_qkv_is_refused_where_the_kernel_cannot_take_it():
    """q and raw together, raw without the visibility words, a tree phase that does not read words (gathered), and
    caches it could not write in place are refused, not computed wrong."""
    from ddtree_bench.engine.gpu.kernels.tree_attention import Config, RawQKV, rope_fits, tree_attend, vis_words

    raw, k, v, path, pos, prefix, _ = _case(1, 8, [20], seed=1, norm=True)
    words = vis_words(path, pos, prefix)
    k1, v1, path1, p1 = k[0], v[0], path[0], prefix[0]
    q = torch.randn(Hq, 9, D, device=DEV)
    with pytest.raises(ValueError, match="instead of q"):
        tree_attend(q, k1, v1, path1, pos, p1, words=words, raw=raw)
    with pytest.raises(ValueError, match="instead of q"):
        tree_attend(None, k1, v1, path1, pos, p1, raw=raw)
    with pytest.raises(ValueError, match="dense tree phase"):
        tree_attend(None, k1, v1, path1, pos, p1, words=words, raw=raw, launch=Config(16, 16, 4, 1))
    strided = torch.randn(Hkv, S, 2 * D, device=DEV)[..., ::2]
    assert not rope_fits(raw, strided, strided, Hq // Hkv * 9)
    half = RawQKV(raw.qkv, Hq, Hkv, raw.q_w, None, raw.eps, raw.cos, raw.sin)   # one norm without the other
    assert not rope_fits(half, k1, v1, Hq // Hkv * 9) and rope_fits(raw, k1, v1, Hq // Hkv * 9)


@pytest.mark.gpu
@triton_only
def test_a_verify_forward_with_tree_rope_equals_it_without(monkeypatch):
    """A whole verify forward on a random Qwen3 target over a built tree, the fused Triton ops and the tree kernel:
    with `tree-rope` on (every layer's q/k/v read raw by the tree kernel, no q/k norm + RoPE launch) the logits,
    hidden states and the cache equal the forward with it off; the feature changes which launch does that work only."""
    from ddtree_bench.engine.gpu import forward
    from ddtree_bench.engine.gpu.forward import StaticKV, group_size, target_forward
    from ddtree_bench.engine.gpu.fused import TritonOps
    from ddtree_bench.engine.gpu.kernels import tree_attention
    from ddtree_bench.engine.gpu.kernels.tree_verify import compile_tree
    from ddtree_bench.engine.loading import random_pair
    from ddtree_bench.engine.tree_vector import StaticTreeBuilder

    target, _ = random_pair(seed=6, vocab_size=97, device=DEV)
    P, B, cap = 21, 10, 64
    logits = torch.randn(L, 97, generator=torch.Generator().manual_seed(9)).to(DEV) * 3
    tok, par, dep = StaticTreeBuilder(L, 97, B, DEV)(logits)
    start = torch.tensor(P, device=DEV)
    ids, pos, _, bias, path = compile_tree(torch.ones(1, dtype=torch.long, device=DEV), tok, par, dep, start, cap,
                                           torch.float32, group_size(target), L)
    prompt = torch.arange(1, P + 1, device=DEV) % 97
    monkeypatch.setattr(tree_attention, "TREE_MIN_ROWS", 1)
    raws, real = [], tree_attention.tree_attend
    monkeypatch.setattr(forward.tree_kernel, "tree_attend",
                        lambda *a, **k: raws.append(k.get("raw") is not None) or real(*a, **k))
    rope_calls, real_rope = [], TritonOps.qkv_rope
    monkeypatch.setattr(TritonOps, "qkv_rope", lambda self, *a: rope_calls.append(1) or real_rope(self, *a))
    outs = {}
    for on in (False, True):
        if on:
            monkeypatch.setenv("DDTREE_GPU_EXPERIMENTAL", "tree-rope")
        cache = target.new_cache(cap)
        target(prompt, torch.arange(P, device=DEV), cache, 0)
        raws.clear()
        rope_calls.clear()
        logits_, hidden = target_forward(target, ids, pos, StaticKV(cache), start, bias, (0, 1), tree_path=path,
                                         ops=TritonOps())
        layers = len(target.model.layers)
        assert raws == [on] * layers and len(rope_calls) == (0 if on else layers)
        outs[on] = (logits_, hidden, cache.k[:, :, : P + B + 1].clone(), cache.v[:, :, : P + B + 1].clone())
    for a, b in zip(outs[True], outs[False]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
