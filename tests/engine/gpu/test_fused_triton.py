"""The Triton layer kernels (engine/gpu/fused.py's TritonOps) against their PyTorch twin: norms,
SiLU-mul, the fused QKV + RoPE that writes only its cache slots, a whole fused target forward, and the
self-test gate at the real head dim 128. They run on CUDA, and in CI on a CPU under Triton's
interpreter (engine/gpu/test_triton_interpreter.py):
    TRITON_INTERPRET=1 python -m pytest -m gpu tests/engine/gpu/test_fused_triton.py
"""

from __future__ import annotations

import pytest
import torch

from ddtree_bench.engine.gpu import fused
from ddtree_bench.engine.gpu.fused import TORCH_OPS
from ddtree_bench.engine.gpu.kernels import layer_ops
from ddtree_bench.engine.gpu.forward import StaticKV, group_size, target_forward, visible_bias
from ddtree_bench.engine.gpu.tree_ops import verify_visible
from ddtree_bench.engine.loading import random_pair

from triton_support import DEV, triton_only

VOCAB = 97


# Triton's interpreter casts fp32 -> bf16 without round-to-nearest-even, so bf16 is checked on GPUs only
DTYPES = ["float32"] + (["bfloat16"] if DEV == "cuda" else [])


def kernel_check(test):
    """A Triton kernel check: marked gpu, skipped where no Triton device is, run at every dtype of DTYPES."""
    return pytest.mark.gpu(triton_only(pytest.mark.parametrize("dtype", DTYPES)(test)))


def _close(got, want, dtype):
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)
    else:  # one bf16 rounding step apart at most, on rare elements
        torch.testing.assert_close(got, want, rtol=8e-3, atol=8e-3)


@kernel_check
@pytest.mark.parametrize("T,N,warps", [(1, 4096, None), (7, 256, None), (33, 96, None), (3, 4096, "2")])
def test_triton_norms_match_the_twin(dtype, T, N, warps, monkeypatch):
    """Both norms against the twin, at the default warps per row and under the A/B knob DDTREE_RMSNORM_WARPS."""
    if warps:
        monkeypatch.setenv("DDTREE_RMSNORM_WARPS", warps)
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(T)
    x, d, w = (torch.randn(*s, generator=g).to(DEV, dt) for s in ((T, N), (T, N), (N,)))
    ops = fused.TritonOps()
    _close(ops.rmsnorm(x, w, 1e-6), TORCH_OPS.rmsnorm(x, w, 1e-6), dt)
    xo, y = ops.add_rmsnorm(x, d, w, 1e-6)
    xr, yr = TORCH_OPS.add_rmsnorm(x, d, w, 1e-6)
    assert torch.equal(xo, xr)  # the residual add rounds once, as PyTorch's
    _close(y, yr, dt)


@kernel_check
@pytest.mark.parametrize("T,I", [(1, 3072), (5, 768), (9, 1500)])
def test_triton_silu_mul_matches_the_twin(dtype, T, I):
    dt = getattr(torch, dtype)
    gu = (torch.randn(T, 2 * I, generator=torch.Generator().manual_seed(I)) * 4).to(DEV, dt)
    _close(fused.TritonOps().silu_mul(gu), TORCH_OPS.silu_mul(gu), dt)


@kernel_check
@pytest.mark.parametrize("T,n_q,n_kv,D,norm", [(1, 32, 8, 128, True), (9, 8, 4, 32, True), (4, 0, 2, 32, True),
                                               (6, 4, 4, 64, False), (3, 6, 2, 48, True), (2, 12, 2, 32, True)])
@pytest.mark.parametrize("tiles", [False, True], ids=["head", "tiles"])
def test_triton_qkv_rope_matches_the_twin_and_writes_only_its_slots(dtype, T, n_q, n_kv, D, norm, tiles, monkeypatch):
    """Both kernels (forced by DDTREE_ROPE_TILES_FROM whatever T): one head per program, and a tile of ROPE_HEADS
    heads, whose tiles here straddle the q/k boundary (12 + 2 heads: the second tile holds q and k heads) or hold
    k heads only."""
    monkeypatch.setenv("DDTREE_ROPE_TILES_FROM", "1" if tiles else "100000")
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


@kernel_check
@pytest.mark.parametrize("slotted", [False, True], ids=["one", "slots"])
@pytest.mark.parametrize("tiles", [False, True], ids=["head", "tiles"])
def test_the_drafters_context_rows_take_the_kernel_with_a_k_norm_alone(dtype, slotted, tiles, monkeypatch):
    """The drafter's context K/V (forward / batch_forward's ctx path: n_q = 0, a k norm and no q norm) run the
    kernel in one launch - they ran the PyTorch twin, ~10 small launches per layer per slot - and equal the twin."""
    monkeypatch.setenv("DDTREE_ROPE_TILES_FROM", "1" if tiles else "100000")
    dt = getattr(torch, dtype)
    C, T, n_kv, D = (3 if slotted else 1), 4, 2, 32
    g = torch.Generator().manual_seed(11)
    rnd = lambda *s: torch.randn(*s, generator=g).to(DEV, dt)  # noqa: E731
    kv, cos, sin, k_w = rnd(C * T, 2 * n_kv * D), rnd(C * T, D), rnd(C * T, D), rnd(D)
    start = torch.tensor([5, 11, 0][:C], device=DEV)
    launches = []
    real = layer_ops.launch
    monkeypatch.setattr(layer_ops, "launch", lambda *a, **k: (launches.append(a[0]), real(*a, **k))[1])
    caches = []
    for ops in (fused.TritonOps(), TORCH_OPS):
        layer = [torch.full((C, n_kv, 24, D), 7.0, device=DEV, dtype=dt) for _ in range(2)]
        if slotted:
            assert ops.qkv_rope_slots(kv, 0, n_kv, None, k_w, 1e-6, cos, sin, *layer, start, T) is None
        else:
            assert ops.qkv_rope(kv, 0, n_kv, None, k_w, 1e-6, cos, sin, layer[0][0], layer[1][0], start[0]) is None
        caches.append(layer)
    assert len(launches) == 1
    _close(caches[0][0], caches[1][0], dt)
    assert torch.equal(caches[0][1], caches[1][1])


@kernel_check
@pytest.mark.parametrize("C,T,n_q,n_kv,D", [(3, 5, 8, 4, 32), (2, 4, 0, 2, 32), (1, 6, 4, 2, 64)])
@pytest.mark.parametrize("tiles", [False, True], ids=["head", "tiles"])
def test_slotted_qkv_rope_is_one_launch_with_each_slots_single_bits(dtype, C, T, n_q, n_kv, D, tiles, monkeypatch):
    """qkv_rope_slots (the batched forwards' one launch for every slot) equals qkv_rope slot by slot bit for bit
    (the same kernel: q [C, n_q, T, D], K/V at each slot's own frontier in its own region) and writes nothing
    else: every other cache slot, other layers and the regions past C keep their fill; and it is one launch."""
    monkeypatch.setenv("DDTREE_ROPE_TILES_FROM", "1" if tiles else "100000")
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(C * 100 + D + T)
    rnd = lambda *s: torch.randn(*s, generator=g).to(DEV, dt)  # noqa: E731
    qkv, cos, sin = rnd(C * T, (n_q + 2 * n_kv) * D), rnd(C * T, D), rnd(C * T, D)
    q_w, k_w = rnd(D), rnd(D)
    start = torch.tensor([5, 11, 0][:C], device=DEV)
    ops = fused.TritonOps()
    slots = [torch.full((2, C + 1, n_kv, 40, D), 7.0, device=DEV, dtype=dt) for _ in range(2)]   # [layers, B, Hkv, S, D]
    launches = []
    real = layer_ops.launch
    monkeypatch.setattr(layer_ops, "launch", lambda *a, **k: (launches.append(a[0]), real(*a, **k))[1])
    q = ops.qkv_rope_slots(qkv, n_q, n_kv, q_w, k_w, 1e-6, cos, sin, slots[0][1, :C], slots[1][1, :C], start, T)
    assert len(launches) == 1
    monkeypatch.setattr(layer_ops, "launch", real)
    one = [torch.full((2, C + 1, n_kv, 40, D), 7.0, device=DEV, dtype=dt) for _ in range(2)]
    qs = [ops.qkv_rope(qkv[c * T:(c + 1) * T], n_q, n_kv, q_w, k_w, 1e-6, cos[c * T:(c + 1) * T], sin[c * T:(c + 1) * T],
                       one[0][1, c], one[1][1, c], start[c]) for c in range(C)]
    if n_q:
        assert q.shape == (C, n_q, T, D) and torch.equal(q, torch.stack(qs))
    else:
        assert q is None
    assert torch.equal(slots[0], one[0]) and torch.equal(slots[1], one[1])
    touched = torch.zeros(C + 1, 40, dtype=torch.bool)
    for c in range(C):
        touched[c, int(start[c]) : int(start[c]) + T] = True
    assert (slots[0][1][~touched.to(DEV)[:, None, :].expand(-1, n_kv, -1)] == 7).all() and (slots[0][0] == 7).all()
    tw = TORCH_OPS.qkv_rope_slots(qkv, n_q, n_kv, q_w, k_w, 1e-6, cos, sin, one[0][0, :C], one[1][0, :C], start, T)
    if n_q:
        _close(q, tw, dt)   # and the PyTorch twin (slot by slot), as qkv_rope's own test allows
    _close(slots[0][1], one[0][0], dt)


@kernel_check
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


def test_qkv_rope_takes_the_head_tiles_from_their_edge(monkeypatch):
    """Below ROPE_TILES_FROM tokens one program per (token, head), from it the tiles (the H200 A/B's band rule);
    the launch is recorded, not run, so this holds on any machine with Triton."""
    from ddtree_bench.engine.gpu.kernels import layer_ops

    if layer_ops.triton is None:
        pytest.skip("needs Triton")
    launched = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *a, **k: launched.append((self.name, grid))

    monkeypatch.setattr(layer_ops, "_qkv_rope_kernel", Recorder("head"))
    monkeypatch.setattr(layer_ops, "_qkv_rope_tiles_kernel", Recorder("tiles"))
    monkeypatch.delenv("DDTREE_ROPE_TILES_FROM", raising=False)
    n_q, n_kv, D = 4, 2, 16
    for T in (layer_ops.ROPE_TILES_FROM - 1, layer_ops.ROPE_TILES_FROM):
        qkv, cos = torch.zeros(T, (n_q + 2 * n_kv) * D), torch.zeros(T, D)
        cache = torch.zeros(n_kv, T + 4, D)
        fused.TritonOps().qkv_rope(qkv, n_q, n_kv, torch.ones(D), torch.ones(D), 1e-6, cos, cos.clone(), cache,
                                   cache.clone(), torch.tensor(0))
    assert launched == [("head", (layer_ops.ROPE_TILES_FROM - 1, n_q + n_kv)), ("tiles", (layer_ops.ROPE_TILES_FROM, 1))]
