"""Fused layer ops for the fixed-shape forwards (static.py): Triton kernels on CUDA, PyTorch as their twin.

Unfused, one decoder layer of the static forward launches about 58 kernels (82 aten calls, counted
in docs/gpu-performance.md): four RMSNorms of ~7 elementwise kernels each, RoPE as cat/neg/mul/add,
two index_copy_ for the K/V write, SiLU and the gate product, seven GEMMs. A replayed CUDA graph
still pays a few microseconds for each small kernel, which is what kept the Qwen3-8B verify forward
~4.6 ms above the issue's reference curve. With these ops a layer is about 10 kernels:

* `merge_projections`: each attention's q/k/v weights become row slices of one [(Hq + 2 Hkv) D, H]
  tensor and each MLP's gate/up of one [2 I, H] tensor. The modules' own weights are re-pointed at
  the slices (same values, no extra memory), so the plain forwards still work, and the static
  forward runs one GEMM where it ran three (two);
* `add_rmsnorm`: residual add and RMSNorm in one pass over the row;
* `qkv_rope`: per-head q/k RMSNorm, RoPE, and the K/V write into cache slots start + t, straight
  from the merged projection's output;
* `silu_mul`: SiLU(gate) * up from the merged gate/up output.

The Triton kernels round where PyTorch rounds: after every op PyTorch runs in the activation dtype
(bf16 products and sums round to bf16; fp32 statistics stay fp32), so they agree with the twin
except for the summation order of RMSNorm's mean of squares and the fp32 exp/rsqrt of the
hardware, a few fp32 ulps before rounding. `TorchOps` is that twin: the same functions in plain
PyTorch, which CPUs (and CI) run. `ops_for(device)` returns `TritonOps` only where Triton is
installed, the device is CUDA and a self-test against the twin passes; otherwise `TorchOps`, with a
warning if Triton was there but failed.
Knows nothing of trees, rounds or graphs; the KV cache it writes is one layer's [Hkv, S, D] tensors.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from ddtree_bench.engine.layers import apply_rope, rms_norm

try:  # Triton ships with CUDA builds of PyTorch; CPU installs may lack it
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - depends on the install
    triton = None
    tl = None


# ---------------------------------------------------------------------------- merged projections


def _merge(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the Linears' weights (and biases) along the output axis; re-point each Linear at its rows."""
    w = torch.cat([m.weight.detach() for m in linears])
    b = torch.cat([m.bias.detach() for m in linears]) if linears[0].bias is not None else None
    row = 0
    for m in linears:
        n = m.weight.shape[0]
        m.weight = nn.Parameter(w[row : row + n], requires_grad=False)
        if b is not None:
            m.bias = nn.Parameter(b[row : row + n], requires_grad=False)
        row += n
    return w, b


def _merged(tensor, first: nn.Linear) -> bool:
    """The merged tensor still backs `first` (a later .to() or load replaces the Linear's weight)."""
    return (tensor is not None and tensor.device == first.weight.device and tensor.dtype == first.weight.dtype
            and tensor.data_ptr() == first.weight.data_ptr())


def merge_projections(model: nn.Module) -> None:
    """Give every attention `qkv_weight`/`qkv_bias` and every SwiGLU MLP `gate_up_weight`/`gate_up_bias`,
    the row-wise concatenation of its projections, which then view those rows. Idempotent; redone if
    the module was moved or reloaded since. Inference only: the views share one storage, so save a
    checkpoint from a model that was never merged (safetensors refuses shared tensors)."""
    with torch.no_grad(), torch.inference_mode(False):
        for m in model.modules():
            if hasattr(m, "q_proj") and not _merged(getattr(m, "qkv_weight", None), m.q_proj):
                m.qkv_weight, m.qkv_bias = _merge([m.q_proj, m.k_proj, m.v_proj])
            if hasattr(m, "gate_proj") and not _merged(getattr(m, "gate_up_weight", None), m.gate_proj):
                m.gate_up_weight, m.gate_up_bias = _merge([m.gate_proj, m.up_proj])


def ensure_merged(model: nn.Module) -> None:
    """merge_projections unless the first attention's merged weight still backs it (cheap: a forward's guard)."""
    first = next((m for m in model.modules() if hasattr(m, "q_proj")), None)
    if first is not None and not _merged(getattr(first, "qkv_weight", None), first.q_proj):
        merge_projections(model)


# ---------------------------------------------------------------------------- the PyTorch twin


class TorchOps:
    """The fused ops written as the unfused PyTorch sequence the plain forwards run."""

    name = "torch"

    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        """x: [..., N] -> w * (x / rms(x)) with fp32 statistics (layers.rms_norm)."""
        return rms_norm(x, w, eps)

    def add_rmsnorm(self, x: torch.Tensor, d: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """x, d: [T, N] -> (x + d, rmsnorm(x + d))."""
        x = x + d
        return x, self.rmsnorm(x, w, eps)

    def qkv_rope(self, qkv: torch.Tensor, n_q: int, n_kv: int, q_w: torch.Tensor | None, k_w: torch.Tensor | None,
                 eps: float, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 start: torch.Tensor) -> torch.Tensor | None:
        """qkv: [T, (n_q + 2 n_kv) D] rows [q heads | k heads | v heads] (n_q may be 0); q_w, k_w: [D] q/k
        RMSNorm weights or None (no q/k norm); cos, sin: [T, D]; k_cache, v_cache: one layer's [Hkv, S, D];
        start: 0-d long. Writes the rows' K/V to slots start .. start+T-1; returns q [n_q, T, D] (None if n_q == 0)."""
        T, D = qkv.shape[0], k_cache.shape[-1]
        q, k, v = qkv.split([n_q * D, n_kv * D, n_kv * D], dim=-1)
        k = k.view(T, n_kv, D)
        if k_w is not None:
            k = self.rmsnorm(k, k_w, eps)
        slots = start + torch.arange(T, device=qkv.device)
        k_cache.index_copy_(1, slots, apply_rope(k.transpose(0, 1), cos, sin))
        v_cache.index_copy_(1, slots, v.view(T, n_kv, D).transpose(0, 1))
        if not n_q:
            return None
        q = q.view(T, n_q, D)
        if q_w is not None:
            q = self.rmsnorm(q, q_w, eps)
        return apply_rope(q.transpose(0, 1), cos, sin).contiguous()

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up: [T, 2 I] = [gate | up] -> silu(gate) * up [T, I]."""
        g, u = gate_up.chunk(2, dim=-1)
        return F.silu(g) * u


TORCH_OPS = TorchOps()


# ---------------------------------------------------------------------------- Triton kernels

if triton is not None:

    @triton.jit
    def _rmsnorm_kernel(X, R, W, Y, XO, N, eps, sx, sr, sy, sxo, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < N
        x = tl.load(X + row * sx + cols, mask=m, other=0.0)
        if HAS_RES:
            r = tl.load(R + row * sr + cols, mask=m, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(XO.dtype.element_ty)
            tl.store(XO + row * sxo + cols, x, mask=m)
        h = x.to(tl.float32)
        var = tl.sum(h * h, axis=0) / N
        h = (h * tl.rsqrt(var + eps)).to(X.dtype.element_ty).to(tl.float32)
        w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
        tl.store(Y + row * sy + cols, (w * h).to(Y.dtype.element_ty), mask=m)

    @triton.jit
    def _head_norm(x1, x2, W, i, m, eps, HALF: tl.constexpr):
        """RMSNorm of one head given as its two halves (fp32 statistics, rounded as RMSNorm rounds)."""
        dt = x1.dtype
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        r = tl.rsqrt((tl.sum(f1 * f1, axis=0) + tl.sum(f2 * f2, axis=0)) / (2 * HALF) + eps)
        w1 = tl.load(W + i, mask=m, other=0.0).to(tl.float32)
        w2 = tl.load(W + HALF + i, mask=m, other=0.0).to(tl.float32)
        return (w1 * (f1 * r).to(dt).to(tl.float32)).to(dt), (w2 * (f2 * r).to(dt).to(tl.float32)).to(dt)

    @triton.jit
    def _qkv_rope_kernel(QKV, sqkv, QW, KW, COS, SIN, scs, Q, KC, VC, sch, scs_slot, START, T, n_q, n_kv, eps,
                         HALF: tl.constexpr, HB: tl.constexpr, HAS_NORM: tl.constexpr):
        t = tl.program_id(0)
        h = tl.program_id(1)               # q heads 0..n_q-1, then k heads; k head h sits at column h*D too
        i = tl.arange(0, HB)
        m = i < HALF
        row = QKV + t * sqkv + h * (2 * HALF)
        x1 = tl.load(row + i, mask=m, other=0.0)
        x2 = tl.load(row + HALF + i, mask=m, other=0.0)
        dt = x1.dtype
        if HAS_NORM:
            if h < n_q:
                x1, x2 = _head_norm(x1, x2, QW, i, m, eps, HALF)
            else:
                x1, x2 = _head_norm(x1, x2, KW, i, m, eps, HALF)
        c1 = tl.load(COS + t * scs + i, mask=m, other=0.0).to(tl.float32)
        c2 = tl.load(COS + t * scs + HALF + i, mask=m, other=0.0).to(tl.float32)
        s1 = tl.load(SIN + t * scs + i, mask=m, other=0.0).to(tl.float32)
        s2 = tl.load(SIN + t * scs + HALF + i, mask=m, other=0.0).to(tl.float32)
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        # x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]; each product and the sum round to dt
        o1 = ((f1 * c1).to(dt).to(tl.float32) + (-f2 * s1).to(dt).to(tl.float32)).to(dt)
        o2 = ((f2 * c2).to(dt).to(tl.float32) + (f1 * s2).to(dt).to(tl.float32)).to(dt)
        if h < n_q:
            out = Q + (h * T + t) * (2 * HALF)
            tl.store(out + i, o1, mask=m)
            tl.store(out + HALF + i, o2, mask=m)
        else:
            slot = tl.load(START) + t
            kb = KC + (h - n_q) * sch + slot * scs_slot
            tl.store(kb + i, o1, mask=m)
            tl.store(kb + HALF + i, o2, mask=m)
            vrow = row + n_kv * (2 * HALF)
            vb = VC + (h - n_q) * sch + slot * scs_slot
            tl.store(vb + i, tl.load(vrow + i, mask=m, other=0.0), mask=m)
            tl.store(vb + HALF + i, tl.load(vrow + HALF + i, mask=m, other=0.0), mask=m)

    @triton.jit
    def _silu_mul_kernel(GU, Y, I, sgu, sy, BLOCK: tl.constexpr):
        t = tl.program_id(0)
        j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = j < I
        g = tl.load(GU + t * sgu + j, mask=m, other=0.0)
        u = tl.load(GU + t * sgu + I + j, mask=m, other=0.0).to(tl.float32)
        gf = g.to(tl.float32)
        s = (gf / (1.0 + tl.exp(-gf))).to(g.dtype).to(tl.float32)   # PyTorch's silu: fp32 math, one rounding
        tl.store(Y + t * sy + j, (s * u).to(Y.dtype.element_ty), mask=m)


def _warps(block: int) -> int:
    return max(1, min(16, block // 256))


class TritonOps(TorchOps):
    """The fused kernels; same signatures and (up to a few fp32 ulps) the same values as TorchOps."""

    name = "triton"

    def rmsnorm(self, x, w, eps):
        if x.dim() != 2 or x.stride(-1) != 1:
            return super().rmsnorm(x, w, eps)
        y = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, w.dtype), device=x.device)
        B = triton.next_power_of_2(x.shape[1])
        _rmsnorm_kernel[(x.shape[0],)](x, x, w, y, x, x.shape[1], eps, x.stride(0), 0, y.stride(0), 0,
                                       HAS_RES=False, BLOCK=B, num_warps=_warps(B))
        return y

    def add_rmsnorm(self, x, d, w, eps):
        if x.dtype != d.dtype or x.stride(-1) != 1 or d.stride(-1) != 1:
            return super().add_rmsnorm(x, d, w, eps)
        xo = torch.empty_like(x)
        y = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, w.dtype), device=x.device)
        B = triton.next_power_of_2(x.shape[1])
        _rmsnorm_kernel[(x.shape[0],)](x, d, w, y, xo, x.shape[1], eps, x.stride(0), d.stride(0), y.stride(0), xo.stride(0),
                                       HAS_RES=True, BLOCK=B, num_warps=_warps(B))
        return xo, y

    def qkv_rope(self, qkv, n_q, n_kv, q_w, k_w, eps, cos, sin, k_cache, v_cache, start):
        T, D = qkv.shape[0], k_cache.shape[-1]
        if (D % 2 or qkv.stride(-1) != 1 or cos.stride(-1) != 1 or cos.stride() != sin.stride()
                or k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1 or (q_w is None) != (k_w is None)):
            return super().qkv_rope(qkv, n_q, n_kv, q_w, k_w, eps, cos, sin, k_cache, v_cache, start)
        q = torch.empty((n_q, T, D), dtype=qkv.dtype, device=qkv.device) if n_q else None
        norm = k_w is not None
        _qkv_rope_kernel[(T, n_q + n_kv)](
            qkv, qkv.stride(0), q_w if norm else qkv, k_w if norm else qkv, cos, sin, cos.stride(0),
            q if n_q else qkv, k_cache, v_cache, k_cache.stride(0), k_cache.stride(1), start, T, n_q, n_kv, eps,
            HALF=D // 2, HB=triton.next_power_of_2(D // 2), HAS_NORM=norm, num_warps=1)
        return q

    def silu_mul(self, gate_up):
        if gate_up.stride(-1) != 1:
            return super().silu_mul(gate_up)
        T, I = gate_up.shape[0], gate_up.shape[1] // 2
        y = torch.empty((T, I), dtype=gate_up.dtype, device=gate_up.device)
        B = 1024
        _silu_mul_kernel[(T, triton.cdiv(I, B))](gate_up, y, I, gate_up.stride(0), y.stride(0), BLOCK=B, num_warps=4)
        return y


# ---------------------------------------------------------------------------- choosing

_CHECKED: dict[tuple, str | None] = {}   # (device, dtype) -> None (passed) or the failure


def self_test(ops: TorchOps, device, dtype: torch.dtype) -> str | None:
    """None if every op of `ops` matches TorchOps on small random inputs (K/V writes included), else what differs."""
    g = torch.Generator().manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=g).to(device=device, dtype=dtype)  # noqa: E731
    tol = dict(rtol=1e-2, atol=1e-2) if dtype in (torch.bfloat16, torch.float16) else dict(rtol=1e-5, atol=1e-5)
    T, H, D, n_q, n_kv, S = 5, 96, 16, 4, 2, 12
    x, d, w = rnd(T, H), rnd(T, H), rnd(H)
    checks = {
        "rmsnorm": (ops.rmsnorm(x, w, 1e-6), TORCH_OPS.rmsnorm(x, w, 1e-6)),
        "add_rmsnorm": (ops.add_rmsnorm(x, d, w, 1e-6), TORCH_OPS.add_rmsnorm(x, d, w, 1e-6)),
    }
    gu = rnd(T, 2 * H)
    checks["silu_mul"] = (ops.silu_mul(gu), TORCH_OPS.silu_mul(gu))
    qkv, cos, sin, qw, kw = rnd(T, (n_q + 2 * n_kv) * D), rnd(T, D), rnd(T, D), rnd(D), rnd(D)
    start = torch.tensor(3, device=device)
    for norm in (True, False):
        caches = [[torch.zeros(n_kv, S, D, device=device, dtype=dtype) for _ in range(2)] for _ in range(2)]
        outs = [o.qkv_rope(qkv, n_q, n_kv, qw if norm else None, kw if norm else None, 1e-6, cos, sin, *c, start)
                for o, c in zip((ops, TORCH_OPS), caches)]
        checks[f"qkv_rope(norm={norm})"] = ((outs[0], *caches[0]), (outs[1], *caches[1]))
    for name, (got, want) in checks.items():
        try:
            torch.testing.assert_close(got, want, **tol)
        except AssertionError as e:
            return f"{name}: {str(e).splitlines()[0]}"
    return None


def ops_for(device, dtype: torch.dtype, kind: str = "auto") -> TorchOps:
    """The ops a forward on `device` in `dtype` should use. kind: auto (Triton on CUDA when it passes its
    self-test) | triton (the same, but a failure raises) | torch (the twin)."""
    if kind == "torch":
        return TORCH_OPS
    dev = torch.device(device)
    if triton is None or dev.type != "cuda":
        if kind == "triton":
            raise RuntimeError("the fused Triton ops need Triton and a CUDA device")
        return TORCH_OPS
    key = (str(dev), dtype)
    if key not in _CHECKED:
        try:
            _CHECKED[key] = self_test(TritonOps(), dev, dtype)
        except Exception as e:  # pragma: no cover - needs a GPU
            _CHECKED[key] = f"{type(e).__name__}: {e}"
        if _CHECKED[key] is not None:
            warnings.warn(f"fused Triton layer ops unusable, using the PyTorch ops: {_CHECKED[key]}")
    if _CHECKED[key] is not None:
        if kind == "triton":
            raise RuntimeError(f"fused Triton layer ops failed their self-test: {_CHECKED[key]}")
        return TORCH_OPS
    return TritonOps()
