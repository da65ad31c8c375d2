"""The PyTorch twin of the fused layer ops: the unfused sequence the plain forwards run, behind the
signatures the fixed-shape forwards (forward.py) call.

`TorchOps` is what CPUs (and CI) run, and what the Triton kernels (kernels/layer_ops.py) are
checked against. Its weight GEMM is F.linear: cublasGemmEx on CUDA, or cuBLASLt where `lt_gemms` says (an H100
SXM unless "cublaslt-off", any card with "cublaslt"): PyTorch's preferred BLAS library is set around the call, and
a captured graph keeps the kernel the call chose. cuBLASLt's heuristic picks other kernels for some few-row shapes
(docs/gpu-performance.md, "2026-12-06 13:09-13:27 UTC"). Knows nothing of trees, rounds or graphs; the KV cache
it writes is one layer's [Hkv, S, D] tensors.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from ddtree_bench.engine.gpu.kernels import experimental
from ddtree_bench.engine.gpu.kernels.common import is_h100_sxm
from ddtree_bench.engine.layers import apply_rope, rms_norm


def lt_gemms(device) -> bool:
    """Whether TorchOps.linear sends a GEMM on `device` through cuBLASLt: an H100 SXM unless "cublaslt-off", any
    CUDA device with "cublaslt"; never off CUDA. Results record it (bench-engine's `blas`)."""
    dev = torch.device(device)
    if dev.type != "cuda" or experimental.enabled("cublaslt-off"):
        return False
    return experimental.enabled("cublaslt") or is_h100_sxm(dev)


@contextlib.contextmanager
def blas_library(backend: str):
    """CUDA GEMMs inside go to `backend` ("cublas", "cublaslt"); the previous choice after."""
    prev = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(backend)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(prev)


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

    def qkv_rope_slots(self, qkv: torch.Tensor, n_q: int, n_kv: int, q_w: torch.Tensor | None,
                       k_w: torch.Tensor | None, eps: float, cos: torch.Tensor, sin: torch.Tensor, k_layer: torch.Tensor,
                       v_layer: torch.Tensor, start: torch.Tensor, T: int) -> torch.Tensor | None:
        """qkv_rope over C slots of T rows each (batch_forward's slotted caches): rows c*T .. c*T+T-1 of qkv, cos,
        sin are slot c's, written into its own region k_layer[c] / v_layer[c] ([C, Hkv, S, D]) at its own frontier
        start[c] ([C] long). Returns q [C, n_q, T, D] (None if n_q == 0). The slow obvious twin: qkv_rope slot by
        slot."""
        qs = []
        for c in range(start.shape[0]):
            s, e = c * T, (c + 1) * T
            qs.append(self.qkv_rope(qkv[s:e], n_q, n_kv, q_w, k_w, eps, cos[s:e], sin[s:e], k_layer[c], v_layer[c],
                                    start[c]))
        return torch.stack(qs) if n_q else None

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up: [T, 2 I] = [gate | up] -> silu(gate) * up [T, I]."""
        g, u = gate_up.chunk(2, dim=-1)
        return F.silu(g) * u

    def linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, K] @ w[N, K]^T (+ b) -> [T, N]: a weight GEMM (F.linear; on cuBLASLt where lt_gemms)."""
        if x.is_cuda and lt_gemms(x.device):
            with blas_library("cublaslt"):
                return F.linear(x, w, b)
        return F.linear(x, w, b)

    def swiglu(self, x: torch.Tensor, gate_up: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        """x [T, K], gate_up [2 I, K] the merged [gate | up] weight (b its bias) -> silu(gate) * up [T, I]."""
        return self.silu_mul(self.linear(x, gate_up, b))

    def linear_add_rmsnorm(self, x: torch.Tensor, inner: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None,
                           norm_w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, N], inner [T, K], w [N, K] -> add_rmsnorm(x, linear(inner, w, b)): a block's output projection,
        the residual add and the next RMSNorm."""
        return self.add_rmsnorm(x, self.linear(inner, w, b), norm_w, eps)


TORCH_OPS = TorchOps()
