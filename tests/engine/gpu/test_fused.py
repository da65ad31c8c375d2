"""The layer-op choice and merged projections of engine/gpu/fused.py, on any machine: merging keeps
every weight and shares storage, is idempotent and redone after a move, the PyTorch ops are the
default off CUDA, and QKV+RoPE without queries writes only the cache. The Triton kernels themselves are
tested in test_fused_triton.py."""

from __future__ import annotations

import pytest
import torch

from ddtree_bench.engine.gpu import fused
from ddtree_bench.engine.gpu.fused import TORCH_OPS, merge_projections
from ddtree_bench.engine.loading import random_pair

VOCAB = 97


def _snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_merge_keeps_every_weight_and_shares_storage():
    target, drafter = random_pair(seed=2, vocab_size=VOCAB)
    before = _snapshot(target), _snapshot(drafter)
    prompt = torch.arange(3, 20)
    ref, _ = target(prompt, torch.arange(len(prompt)), target.new_cache(32), 0)
    merge_projections(target)
    merge_projections(drafter)
    for model, snap in zip((target, drafter), before):
        after = model.state_dict()
        assert after.keys() == snap.keys() and all(torch.equal(after[k], snap[k]) for k in snap)
    attn, mlp = target.model.layers[1].self_attn, target.model.layers[1].mlp
    D = attn.head_dim
    assert attn.qkv_weight.shape == ((attn.n_heads + 2 * attn.n_kv) * D, target.cfg.hidden_size)
    assert attn.k_proj.weight.data_ptr() == attn.qkv_weight[attn.n_heads * D :].data_ptr()
    assert mlp.up_proj.weight.data_ptr() == mlp.gate_up_weight[target.cfg.intermediate_size :].data_ptr()
    got, _ = target(prompt, torch.arange(len(prompt)), target.new_cache(32), 0)
    assert torch.equal(got, ref)  # the plain forward reads the views: bit for bit the same


def test_merge_is_idempotent_and_redone_after_a_move():
    target, _ = random_pair(seed=2, vocab_size=VOCAB)
    merge_projections(target)
    attn = target.model.layers[0].self_attn
    w = attn.qkv_weight
    merge_projections(target)
    assert attn.qkv_weight is w
    target.to(torch.float64)  # replaces every parameter: the merged tensor no longer backs them
    fused.ensure_merged(target)  # the static forwards' guard notices and merges again
    last = target.model.layers[-1].mlp
    assert attn.qkv_weight.dtype == torch.float64 and attn.qkv_weight.data_ptr() == attn.q_proj.weight.data_ptr()
    assert last.gate_up_weight.dtype == torch.float64 and last.gate_up_weight.data_ptr() == last.gate_proj.weight.data_ptr()


def test_torch_ops_are_the_default_off_cuda():
    assert fused.ops_for("cpu", torch.float32) is TORCH_OPS
    with pytest.raises(RuntimeError, match="need Triton and a CUDA device"):
        fused.ops_for("cpu", torch.float32, "triton")


def test_qkv_rope_without_queries_writes_only_the_cache():
    g = torch.Generator().manual_seed(0)
    T, n_kv, D, S = 3, 2, 8, 10
    kv = torch.randn(T, 2 * n_kv * D, generator=g)
    kc, vc = torch.zeros(n_kv, S, D), torch.zeros(n_kv, S, D)
    cos, sin = torch.ones(T, D), torch.zeros(T, D)   # RoPE at angle 0 is the identity
    assert TORCH_OPS.qkv_rope(kv, 0, n_kv, None, None, 0.0, cos, sin, kc, vc, torch.tensor(4)) is None
    assert torch.equal(kc[:, 4:7], kv[:, : n_kv * D].view(T, n_kv, D).transpose(0, 1))
    assert torch.equal(vc[:, 4:7], kv[:, n_kv * D :].view(T, n_kv, D).transpose(0, 1))
    assert not kc[:, :4].any() and not kc[:, 7:].any()


@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, 5), (False, 6)])
def test_slotted_draft_masks_equal_each_slots_own(causal, window):
    """The batched draft builds every slot's drafter bias in one set of ops (draft_visible over a [C] start, then
    visible_bias with a slot axis): the same bits as each slot's 0-d build stacked, for full, causal and sliding
    layers; and the AR verify's slotted bias likewise."""
    from types import SimpleNamespace

    from ddtree_bench.engine.gpu.forward import draft_visible, visible_bias

    d = SimpleNamespace(cfg=SimpleNamespace(layer_causal=(causal,), layer_window=(window,)))
    start, Tb, S, g = torch.tensor([0, 3, 17, 9]), 4, 32, 3
    got = visible_bias(draft_visible(d, 0, start, Tb, S), torch.bfloat16, g)
    want = torch.stack([visible_bias(draft_visible(d, 0, s, Tb, S), torch.bfloat16, g) for s in start])
    assert got.shape == (4, g * Tb, S) and torch.equal(got, want)
    assert not torch.equal(want[0], want[2])   # the slots' masks differ: a broadcast of one slot's would fail
    cols = torch.arange(S)
    ar = visible_bias(cols <= start[:, None, None], torch.float32, g)
    assert torch.equal(ar, torch.stack([visible_bias((cols <= s)[None, :], torch.float32, g) for s in start]))
