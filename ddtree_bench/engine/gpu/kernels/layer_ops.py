"""The fused layer ops as Triton kernels (`TritonOps`): residual add + RMSNorm, q/k norm + RoPE + the
K/V write, SiLU * up - same signatures and, up to a few fp32 ulps, the same values as the PyTorch
twin (ops.TorchOps), which each method falls back to for layouts the kernels do not take.

The kernels round where PyTorch rounds: after every op PyTorch runs in the activation dtype (bf16
products and sums round to bf16; fp32 statistics stay fp32), so they agree with the twin except for
the summation order of RMSNorm's mean of squares and the fp32 exp/rsqrt of the hardware.
The q/k norm + RoPE kernel comes in two launch shapes with the twin's values (not each other's bits): one
program per (token, head) below ROPE_TILES_FROM tokens, and from there one program per (token, ROPE_HEADS
heads) over [heads, D/2] tiles, which loads the token's cos/sin once for its heads.
Needs Triton (CUDA, or the CPU interpreter in tests); knows nothing of models.
"""

from __future__ import annotations

import torch

from ddtree_bench.engine.gpu.kernels import experimental, gemm, pdl
from ddtree_bench.engine.gpu.kernels.common import tl, triton
from ddtree_bench.engine.gpu.kernels.warm import launch
from ddtree_bench.engine.gpu.ops import TorchOps


if triton is not None:

    @triton.jit
    def _rmsnorm_kernel(X, R, W, Y, XO, N, eps, sx, sr, sy, sxo, n_parts, s_part, HAS_RES: tl.constexpr,
                        BLOCK: tl.constexpr, USE_GDC: tl.constexpr, PARTS: tl.constexpr = False,
                        GDC_LATE: tl.constexpr = False):
        pdl.enter(USE_GDC, GDC_LATE)
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        m = cols < N
        x = tl.load(X + row * sx + cols, mask=m, other=0.0)
        if HAS_RES:
            if PARTS:   # R: a split GEMM's fp32 partials [n_parts, rows, N], summed in order as gemm's reduce sums them
                acc = tl.zeros((BLOCK,), dtype=tl.float32)
                for s in range(0, n_parts):
                    acc += tl.load(R + s * s_part + row * sr + cols, mask=m, other=0.0)
                r = acc.to(X.dtype.element_ty)
            else:
                r = tl.load(R + row * sr + cols, mask=m, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(XO.dtype.element_ty)
            tl.store(XO + row * sxo + cols, x, mask=m)
        h = x.to(tl.float32)
        var = tl.sum(h * h, axis=0) / N
        h = (h * tl.rsqrt(var + eps)).to(X.dtype.element_ty).to(tl.float32)
        w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
        pdl.release(USE_GDC, GDC_LATE)
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
    def _qkv_rope_kernel(QKV, sqkv, QW, KW, COS, SIN, scs, Q, KC, VC, sch, scs_slot, START, T, n_q, n_kv, eps, scc,
                         HALF: tl.constexpr, HB: tl.constexpr, HAS_NORM: tl.constexpr, USE_GDC: tl.constexpr,
                         GDC_LATE: tl.constexpr = False):
        pdl.enter(USE_GDC, GDC_LATE)
        tt = tl.program_id(0)              # row tt of C slots x T tokens: slot c = tt // T, its token t (C = 1: t = tt)
        h = tl.program_id(1)               # q heads 0..n_q-1, then k heads; k head h sits at column h*D too
        c = tt // T
        t = tt - c * T
        i = tl.arange(0, HB)
        m = i < HALF
        row = QKV + tt * sqkv + h * (2 * HALF)
        x1 = tl.load(row + i, mask=m, other=0.0)
        x2 = tl.load(row + HALF + i, mask=m, other=0.0)
        dt = x1.dtype
        if HAS_NORM:
            if h < n_q:
                x1, x2 = _head_norm(x1, x2, QW, i, m, eps, HALF)
            else:
                x1, x2 = _head_norm(x1, x2, KW, i, m, eps, HALF)
        c1 = tl.load(COS + tt * scs + i, mask=m, other=0.0).to(tl.float32)
        c2 = tl.load(COS + tt * scs + HALF + i, mask=m, other=0.0).to(tl.float32)
        s1 = tl.load(SIN + tt * scs + i, mask=m, other=0.0).to(tl.float32)
        s2 = tl.load(SIN + tt * scs + HALF + i, mask=m, other=0.0).to(tl.float32)
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        # x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]; each product and the sum round to dt
        o1 = ((f1 * c1).to(dt).to(tl.float32) + (-f2 * s1).to(dt).to(tl.float32)).to(dt)
        o2 = ((f2 * c2).to(dt).to(tl.float32) + (f1 * s2).to(dt).to(tl.float32)).to(dt)
        pdl.release(USE_GDC, GDC_LATE)
        if h < n_q:
            out = Q + ((c * n_q + h) * T + t) * (2 * HALF)
            tl.store(out + i, o1, mask=m)
            tl.store(out + HALF + i, o2, mask=m)
        else:
            slot = tl.load(START + c) + t
            kb = KC + c.to(tl.int64) * scc + (h - n_q) * sch + slot * scs_slot
            tl.store(kb + i, o1, mask=m)
            tl.store(kb + HALF + i, o2, mask=m)
            vrow = row + n_kv * (2 * HALF)
            vb = VC + c.to(tl.int64) * scc + (h - n_q) * sch + slot * scs_slot
            tl.store(vb + i, tl.load(vrow + i, mask=m, other=0.0), mask=m)
            tl.store(vb + HALF + i, tl.load(vrow + HALF + i, mask=m, other=0.0), mask=m)

    @triton.jit
    def _qkv_rope_tiles_kernel(QKV, sqkv, QW, KW, COS, SIN, scs, Q, KC, VC, sch, scs_slot, START, T, n_q, n_kv, eps,
                               scc, HALF: tl.constexpr, HB: tl.constexpr, HG: tl.constexpr, HAS_NORM: tl.constexpr,
                               USE_GDC: tl.constexpr, GDC_LATE: tl.constexpr = False):
        """_qkv_rope_kernel's work for HG heads of one token per program (a [HG, HALF] tile per half): the
        same values, the token's cos/sin loaded once for its heads, and n_heads / HG times fewer programs."""
        pdl.enter(USE_GDC, GDC_LATE)
        tt = tl.program_id(0)              # row tt of C slots x T tokens (as _qkv_rope_kernel)
        c = tt // T
        t = tt - c * T
        heads = tl.program_id(1) * HG + tl.arange(0, HG)   # q heads 0..n_q-1, then k heads
        i = tl.arange(0, HB)
        is_q = heads < n_q
        is_k = (heads >= n_q) & (heads < n_q + n_kv)
        m = (is_q | is_k)[:, None] & (i < HALF)[None, :]
        row = QKV + tt * sqkv + heads[:, None] * (2 * HALF) + i[None, :]
        x1 = tl.load(row, mask=m, other=0.0)
        x2 = tl.load(row + HALF, mask=m, other=0.0)
        dt = x1.dtype
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        if HAS_NORM:   # _head_norm per row: fp32 statistics, rounded as RMSNorm rounds
            r = tl.rsqrt((tl.sum(f1 * f1, axis=1) + tl.sum(f2 * f2, axis=1)) / (2 * HALF) + eps)[:, None]
            wm = i < HALF
            w1 = tl.where(is_q[:, None], tl.load(QW + i, mask=wm, other=0.0)[None, :],
                          tl.load(KW + i, mask=wm, other=0.0)[None, :]).to(tl.float32)
            w2 = tl.where(is_q[:, None], tl.load(QW + HALF + i, mask=wm, other=0.0)[None, :],
                          tl.load(KW + HALF + i, mask=wm, other=0.0)[None, :]).to(tl.float32)
            f1 = (w1 * (f1 * r).to(dt).to(tl.float32)).to(dt).to(tl.float32)
            f2 = (w2 * (f2 * r).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        cm = i < HALF
        c1 = tl.load(COS + tt * scs + i, mask=cm, other=0.0).to(tl.float32)[None, :]
        c2 = tl.load(COS + tt * scs + HALF + i, mask=cm, other=0.0).to(tl.float32)[None, :]
        s1 = tl.load(SIN + tt * scs + i, mask=cm, other=0.0).to(tl.float32)[None, :]
        s2 = tl.load(SIN + tt * scs + HALF + i, mask=cm, other=0.0).to(tl.float32)[None, :]
        o1 = ((f1 * c1).to(dt).to(tl.float32) + (-f2 * s1).to(dt).to(tl.float32)).to(dt)
        o2 = ((f2 * c2).to(dt).to(tl.float32) + (f1 * s2).to(dt).to(tl.float32)).to(dt)
        pdl.release(USE_GDC, GDC_LATE)
        qm = is_q[:, None] & m
        out = Q + ((c * n_q + heads[:, None]) * T + t) * (2 * HALF) + i[None, :]
        tl.store(out, o1, mask=qm)
        tl.store(out + HALF, o2, mask=qm)
        km = is_k[:, None] & m
        slot = tl.load(START + c) + t
        kv_off = c.to(tl.int64) * scc + (heads - n_q)[:, None] * sch + slot * scs_slot + i[None, :]
        tl.store(KC + kv_off, o1, mask=km)
        tl.store(KC + kv_off + HALF, o2, mask=km)
        vrow = row + n_kv * (2 * HALF)
        tl.store(VC + kv_off, tl.load(vrow, mask=km, other=0.0), mask=km)
        tl.store(VC + kv_off + HALF, tl.load(vrow + HALF, mask=km, other=0.0), mask=km)

    @triton.jit
    def _silu_mul_kernel(GU, Y, I, sgu, sy, BLOCK: tl.constexpr, USE_GDC: tl.constexpr,
                         GDC_LATE: tl.constexpr = False):
        pdl.enter(USE_GDC, GDC_LATE)
        t = tl.program_id(0)
        j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = j < I
        g = tl.load(GU + t * sgu + j, mask=m, other=0.0)
        u = tl.load(GU + t * sgu + I + j, mask=m, other=0.0).to(tl.float32)
        gf = g.to(tl.float32)
        s = (gf / (1.0 + tl.exp(-gf))).to(g.dtype).to(tl.float32)   # PyTorch's silu: fp32 math, one rounding
        pdl.release(USE_GDC, GDC_LATE)
        tl.store(Y + t * sy + j, (s * u).to(Y.dtype.element_ty), mask=m)


# heads per program and warps of _qkv_rope_tiles_kernel, and the tokens from which it runs (DDTREE_ROPE_TILES_FROM in
# an A/B): the one-head kernel's 40 one-warp programs per token cap an H200 at 32 resident programs per SM; in one-process
# A/B on the H200 the tiles took 0.1-2.1% off the whole forward at n = 256-1024 (11 of 12 measurements; +0.4% in one)
# and added 0.3-2.0% at n = 1-64
# (docs/gpu-performance.md, "H200, 2026-12-02, 04:00 UTC"); the edge sits between 128 (even) and 256
ROPE_HEADS = 8
ROPE_WARPS = 2
ROPE_TILES_FROM = 192


def _q_weight(n_q: int, q_w, k_w):
    """The q-norm weight the kernels take: with no q rows (n_q = 0, the drafter's context K/V) and a k norm, the k
    weight stands in (no program reads it), so a k-only norm runs the kernel instead of the PyTorch twin."""
    return k_w if n_q == 0 and q_w is None else q_w


def _warps(block: int) -> int:
    """Warps of a one-row RMSNorm program over `block` columns (DDTREE_RMSNORM_WARPS in an A/B)."""
    return experimental.knob("RMSNORM_WARPS", max(1, min(16, block // 256)), (1, 2, 4, 8, 16))


def _launch_opts(device, warps: int, rows: int) -> dict:
    """num_warps, and programmatic dependent launch where kernels/pdl.py enables it for a launch over `rows` tokens."""
    return dict(num_warps=warps, **pdl.gdc_options(device, rows))


class TritonOps(TorchOps):
    """The fused kernels; same signatures and (up to a few fp32 ulps) the same values as TorchOps.
    gemm_config(M, N, K, dtype, device, swiglu) picks the weight GEMMs' Triton launch shape or None for
    cuBLAS (default: kernels/gemm.config, the H200 table; gemm.cublas_only: cuBLAS everywhere). fused_reduce:
    a split GEMM's partials are summed by the residual add + RMSNorm after it (linear_add_rmsnorm)."""

    name = "triton"

    def __init__(self, gemm_config=gemm.config, fused_reduce: bool = True):
        self.gemm_config = gemm_config
        self.fused_reduce = fused_reduce

    def rmsnorm(self, x, w, eps):
        if x.dim() != 2 or x.stride(-1) != 1:
            return super().rmsnorm(x, w, eps)
        y = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, w.dtype), device=x.device)
        B = triton.next_power_of_2(x.shape[1])
        launch(_rmsnorm_kernel, (x.shape[0],), x, x, w, y, x, x.shape[1], eps, x.stride(0), 0, y.stride(0), 0, 0, 0,
               HAS_RES=False, BLOCK=B, **_launch_opts(x.device, _warps(B), x.shape[0]))
        return y

    def add_rmsnorm(self, x, d, w, eps):
        if x.dtype != d.dtype or x.stride(-1) != 1 or d.stride(-1) != 1:
            return super().add_rmsnorm(x, d, w, eps)
        return self._add_rmsnorm(x, d, w, eps)

    def _add_rmsnorm(self, x, d, w, eps, sums: "gemm.SplitSums | None" = None):
        """The residual add + RMSNorm kernel on d [T, N], or on a split GEMM's partials (sums)."""
        xo = torch.empty_like(x)
        y = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, w.dtype), device=x.device)
        B = triton.next_power_of_2(x.shape[1])
        r = d if sums is None else sums.parts
        n_parts, s_part = (0, 0) if sums is None else (r.shape[0], r.stride(0))
        launch(_rmsnorm_kernel, (x.shape[0],), x, r, w, y, xo, x.shape[1], eps, x.stride(0), r.stride(-2), y.stride(0),
               xo.stride(0), n_parts, s_part, HAS_RES=True, BLOCK=B, PARTS=sums is not None,
               **_launch_opts(x.device, _warps(B), x.shape[0]))
        return xo, y

    def qkv_rope(self, qkv, n_q, n_kv, q_w, k_w, eps, cos, sin, k_cache, v_cache, start):
        q_w = _q_weight(n_q, q_w, k_w)
        if not self._rope_ok(qkv, q_w, k_w, cos, sin, k_cache, v_cache):
            return super().qkv_rope(qkv, n_q, n_kv, q_w, k_w, eps, cos, sin, k_cache, v_cache, start)
        q = self._qkv_rope(qkv, n_q, n_kv, q_w, k_w, eps, cos, sin, k_cache, v_cache, start, qkv.shape[0], 1, 0)
        return q[0] if n_q else None

    def qkv_rope_slots(self, qkv, n_q, n_kv, q_w, k_w, eps, cos, sin, k_layer, v_layer, start, T):
        """TorchOps.qkv_rope_slots in ONE launch for every slot (rows c*T.. of slot c; the same kernel as
        qkv_rope, whose C = 1 case it is, so each slot's rows get qkv_rope's bits)."""
        C = start.shape[0]
        q_w = _q_weight(n_q, q_w, k_w)
        if (k_layer.dim() != 4 or k_layer.stride(0) != v_layer.stride(0) or start.stride(0) != 1
                or not self._rope_ok(qkv, q_w, k_w, cos, sin, k_layer[0], v_layer[0])):
            return super().qkv_rope_slots(qkv, n_q, n_kv, q_w, k_w, eps, cos, sin, k_layer, v_layer, start, T)
        q = self._qkv_rope(qkv, n_q, n_kv, q_w, k_w, eps, cos, sin, k_layer[0], v_layer[0], start, T, C,
                           k_layer.stride(0))
        return q if n_q else None

    @staticmethod
    def _rope_ok(qkv, q_w, k_w, cos, sin, k_cache, v_cache) -> bool:
        D = k_cache.shape[-1]
        return not (D % 2 or qkv.stride(-1) != 1 or cos.stride(-1) != 1 or cos.stride() != sin.stride()
                    or k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1 or (q_w is None) != (k_w is None))

    def _qkv_rope(self, qkv, n_q, n_kv, q_w, k_w, eps, cos, sin, k_cache, v_cache, start, T, C, scc):
        """The launch over C slots x T rows; k_cache / v_cache: slot 0's [Hkv, S, D], slot c's at + c * scc."""
        D = k_cache.shape[-1]
        q = torch.empty((C, n_q, T, D), dtype=qkv.dtype, device=qkv.device) if n_q else None
        norm = k_w is not None
        args = (qkv, qkv.stride(0), q_w if norm else qkv, k_w if norm else qkv, cos, sin, cos.stride(0),
                q if n_q else qkv, k_cache, v_cache, k_cache.stride(0), k_cache.stride(1), start, T, n_q, n_kv, eps, scc)
        consts = dict(HALF=D // 2, HB=triton.next_power_of_2(D // 2), HAS_NORM=norm)
        if C * T >= experimental.knob("ROPE_TILES_FROM", ROPE_TILES_FROM):
            launch(_qkv_rope_tiles_kernel, (C * T, triton.cdiv(n_q + n_kv, ROPE_HEADS)),
                   *args, HG=ROPE_HEADS, **consts, **_launch_opts(qkv.device, ROPE_WARPS, C * T))
        else:
            launch(_qkv_rope_kernel, (C * T, n_q + n_kv), *args, **consts, **_launch_opts(qkv.device, 1, C * T))
        return q

    def silu_mul(self, gate_up):
        if gate_up.stride(-1) != 1:
            return super().silu_mul(gate_up)
        T, I = gate_up.shape[0], gate_up.shape[1] // 2
        y = torch.empty((T, I), dtype=gate_up.dtype, device=gate_up.device)
        B = 1024
        launch(_silu_mul_kernel, (T, triton.cdiv(I, B)), gate_up, y, I, gate_up.stride(0), y.stride(0), BLOCK=B,
               **_launch_opts(gate_up.device, 4, T))
        return y

    def _gemm(self, x, w, b, n: int, swiglu: bool):
        """The Triton GEMM's launch shape for this call, or None (cuBLAS: a bias, a layout it does not take, no table entry)."""
        if b is not None or x.dim() != 2 or x.stride(-1) != 1 or w.stride(-1) != 1:
            return None
        return self.gemm_config(x.shape[0], n, w.shape[1], x.dtype, x.device, swiglu=swiglu)

    def linear(self, x, w, b=None):
        c = self._gemm(x, w, b, w.shape[0], False)
        return super().linear(x, w, b) if c is None else gemm.linear(x, w, c)

    def swiglu(self, x, gate_up, b=None):
        c = self._gemm(x, gate_up, b, gate_up.shape[0] // 2, True)
        return super().swiglu(x, gate_up, b) if c is None else gemm.swiglu(x, gate_up, c)

    def linear_add_rmsnorm(self, x, inner, w, b, norm_w, eps):
        """With fused_reduce and a split GEMM, the residual add + RMSNorm kernel sums the GEMM's partials itself
        (gemm.SplitSums: the same sum, in the same order, as the reduce kernel it replaces, so the same bits) -
        one launch fewer per projection; on the H200 1.2-2.3% off the whole forward at n <= 64, the same bits
        (docs/gpu-performance.md, "H200, 2026-12-02, 04:00 UTC")."""
        c = self._gemm(inner, w, b, w.shape[0], False)
        if c is None:
            return self.add_rmsnorm(x, TorchOps.linear(self, inner, w, b), norm_w, eps)
        fuse = c.split_k > 1 and self.fused_reduce and x.dtype == inner.dtype and x.stride(-1) == 1
        d = gemm.linear_unreduced(inner, w, c) if fuse else gemm.linear(inner, w, c)
        if isinstance(d, gemm.SplitSums):
            return self._add_rmsnorm(x, None, norm_w, eps, sums=d)
        return self.add_rmsnorm(x, d, norm_w, eps)
