"""The fused layer ops (engine/fused.py) against their PyTorch twin, and merged projections.

The merge tests run everywhere. The Triton kernels run on CUDA; without a GPU they can be checked
on a CPU through Triton's interpreter (slow; not run by CI):
    pip install --target /tmp/tsite triton
    PYTHONPATH=/tmp/tsite TRITON_INTERPRET=1 python -m pytest -m gpu tests/test_fused.py
"""

from __future__ import annotations

import os

import pytest
import torch

from ddtree_bench.engine.gpu import fused
from ddtree_bench.engine.gpu.fused import TORCH_OPS, merge_projections
from ddtree_bench.engine.gpu.forward import StaticKV, group_size, target_forward, visible_bias
from ddtree_bench.engine.gpu.tree_ops import verify_visible
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


# ---------------------------------------------------------------------------- Triton kernels


def _triton_device() -> str | None:
    if fused.triton is None:
        return None
    if torch.cuda.is_available():
        return "cuda"
    return "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else None


DEV = _triton_device()
triton_only = pytest.mark.skipif(DEV is None, reason="needs Triton on CUDA (or TRITON_INTERPRET=1)")
# Triton's interpreter casts fp32 -> bf16 without round-to-nearest-even, so bf16 is checked on GPUs only
DTYPES = ["float32"] + (["bfloat16"] if DEV == "cuda" else [])


def _close(got, want, dtype):
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)
    else:  # one bf16 rounding step apart at most, on rare elements
        torch.testing.assert_close(got, want, rtol=8e-3, atol=8e-3)


@pytest.mark.gpu
@triton_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,N", [(1, 4096), (7, 256), (33, 96)])
def test_triton_norms_match_the_twin(dtype, T, N):
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(T)
    x, d, w = (torch.randn(*s, generator=g).to(DEV, dt) for s in ((T, N), (T, N), (N,)))
    ops = fused.TritonOps()
    _close(ops.rmsnorm(x, w, 1e-6), TORCH_OPS.rmsnorm(x, w, 1e-6), dt)
    xo, y = ops.add_rmsnorm(x, d, w, 1e-6)
    xr, yr = TORCH_OPS.add_rmsnorm(x, d, w, 1e-6)
    assert torch.equal(xo, xr)  # the residual add rounds once, as PyTorch's
    _close(y, yr, dt)


@pytest.mark.gpu
@triton_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,I", [(1, 3072), (5, 768), (9, 1500)])
def test_triton_silu_mul_matches_the_twin(dtype, T, I):
    dt = getattr(torch, dtype)
    gu = (torch.randn(T, 2 * I, generator=torch.Generator().manual_seed(I)) * 4).to(DEV, dt)
    _close(fused.TritonOps().silu_mul(gu), TORCH_OPS.silu_mul(gu), dt)


@pytest.mark.gpu
@triton_only
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,n_q,n_kv,D,norm", [(1, 32, 8, 128, True), (9, 8, 4, 32, True), (4, 0, 2, 32, True),
                                               (6, 4, 4, 64, False), (3, 6, 2, 48, True)])
def test_triton_qkv_rope_matches_the_twin_and_writes_only_its_slots(dtype, T, n_q, n_kv, D, norm):
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(D + T)
    rnd = lambda *s: torch.randn(*s, generator=g).to(DEV, dt)  # noqa: E731
    qkv, cos, sin = rnd(T, (n_q + 2 * n_kv) * D), rnd(T, D), rnd(T, D)
    q_w, k_w = (rnd(D), rnd(D)) if norm else (None, None)
    start = torch.tensor(5, device=DEV)
    outs = []
    for ops in (fused.TritonOps(), TORCH_OPS):
        full = [torch.full((3, n_kv, 40, D), 7.0, device=DEV, dtype=dt) for _ in range(2)]  # [layers, Hkv, S, D]
        caches = [c[1, :, :24] for c in full]   # one layer, narrowed to 24 slots as bench-engine does
        q = ops.qkv_rope(qkv, n_q, n_kv, q_w, k_w, 1e-6, cos, sin, *caches, start)
        outs.append((q, *full))
    (q, kc, vc), (qr, kr, vr) = outs
    if n_q:
        _close(q, qr, dt)
    else:
        assert q is None and qr is None
    _close(kc, kr, dt)
    assert torch.equal(vc, vr)  # V is copied, not computed
    touched = torch.zeros(40, dtype=torch.bool)
    touched[5 : 5 + T] = True
    assert (kc[:, :, ~touched] == 7).all() and (kc[[0, 2]] == 7).all()


@pytest.mark.gpu
@triton_only
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_target_forward_matches_the_twin(dtype):
    """Whole verify forward on a random Qwen3 pair: Triton ops vs the PyTorch twin, same cache, same logits."""
    dt = getattr(torch, dtype)
    target, _ = random_pair(seed=3, vocab_size=VOCAB, dtype=dtype, device=DEV)
    P, T, cap = 30, 12, 64
    prompt = torch.arange(1, P + 1, device=DEV) % VOCAB
    ids = torch.arange(40, 40 + T, device=DEV)
    pos = P + torch.arange(T, device=DEV)
    anc = torch.ones(T, T, dtype=torch.bool, device=DEV).tril()
    start = torch.tensor(P, device=DEV)
    outs = []
    for ops in (fused.ops_for(DEV, dt, "triton") if DEV == "cuda" else fused.TritonOps(), TORCH_OPS):
        cache = target.new_cache(cap)
        target(prompt, torch.arange(P, device=DEV), cache, 0)
        bias = visible_bias(verify_visible(anc, start, cap), dt, group_size(target))
        logits, hidden = target_forward(target, ids, pos, StaticKV(cache), start, bias, (0, 2), ops=ops)
        outs.append((logits.float(), hidden.float(), cache.k[:, :, : P + T].float()))
    tol = dict(rtol=1e-4, atol=1e-4) if dt == torch.float32 else dict(rtol=5e-2, atol=5e-2)
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, **tol)
    assert torch.equal(outs[0][0].argmax(-1), outs[1][0].argmax(-1)) or dt != torch.float32


@pytest.mark.gpu
@triton_only
def test_the_self_test_passes_at_the_real_head_dim():
    """ops_for's gate (fused.self_test) compares every Triton op with the twin at head dim 128, the
    real models' (it used 16, where a kernel bug at 128 lanes could hide)."""
    assert fused.self_test(fused.TritonOps(), DEV, torch.float32) is None
