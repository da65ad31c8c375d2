"""Fused layer ops for the fixed-shape forwards (forward.py): Triton kernels on CUDA, PyTorch as their twin.

Unfused, one decoder layer of the static forward launches dozens of kernels: four RMSNorms of
several elementwise kernels each, RoPE as cat/neg/mul/add, two index_copy_ for the K/V write, SiLU
and the gate product, seven GEMMs, and a replayed CUDA graph still pays a few microseconds for each
small kernel (counts and timings: docs/gpu-performance.md). With these ops a layer is about 10 kernels:

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
hardware, a few fp32 ulps before rounding. `TorchOps` (ops.py) is that twin: the same functions in
plain PyTorch, which CPUs (and CI) run; `TritonOps` lives in kernels/layer_ops.py. `ops_for(device)` returns `TritonOps` only where Triton is
installed, the device is CUDA and a self-test against the twin passes (its kernels compiled at once first:
`compile_self_test`); otherwise `TorchOps`, with a warning if Triton was there but failed.
Knows nothing of trees, rounds or graphs; the KV cache it writes is one layer's [Hkv, S, D] tensors.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from ddtree_bench.engine.gpu.kernels.common import triton
from ddtree_bench.engine.gpu.kernels.layer_ops import TritonOps
from ddtree_bench.engine.gpu.ops import TORCH_OPS, TorchOps

__all__ = ["merge_projections", "ensure_merged", "warm_linears", "ops_for", "self_test", "TorchOps", "TORCH_OPS",
           "TritonOps", "triton"]


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


def warm_linears(models, ops: TorchOps, rows, device) -> int:
    """Compile, concurrently (kernels/warm.py, a thread per variant), the weight-GEMM kernels the static
    forwards of `models` (merged) launch through `ops` at each row count of `rows` - so a new budget's
    first verify waits for its slowest GEMM variant, not for each in turn. Only TritonOps has any (its
    table's launch shapes; shapes it leaves to cuBLAS are skipped). Returns the launches warmed."""
    from ddtree_bench.engine.gpu.kernels.warm import warm

    if not hasattr(ops, "gemm_config"):
        return 0
    weights: dict[tuple, tuple[torch.Tensor, bool]] = {}
    for model in models:
        for m in model.modules():
            for w, swiglu in ((getattr(m, "qkv_weight", None), False), (getattr(m, "gate_up_weight", None), True)):
                if w is not None:
                    weights.setdefault((tuple(w.shape), swiglu), (w, swiglu))
            for name in ("o_proj", "down_proj", "lm_head"):
                lin = getattr(m, name, None)
                if isinstance(lin, nn.Linear) and lin.bias is None:
                    weights.setdefault((tuple(lin.weight.shape), False), (lin.weight, False))

    def calls():
        for n in rows:
            for w, swiglu in weights.values():
                width = w.shape[0] // 2 if swiglu else w.shape[0]
                if ops.gemm_config(n, width, w.shape[1], w.dtype, w.device, swiglu=swiglu) is not None:
                    x = torch.empty((n, w.shape[1]), dtype=w.dtype, device=w.device)
                    (ops.swiglu if swiglu else ops.linear)(x, w)

    with torch.no_grad():
        return warm(calls, device, per="variant")


# ---------------------------------------------------------------------------- choosing

_CHECKED: dict[tuple, str | None] = {}   # (device, dtype) -> None (passed) or the failure


def self_test(ops: TorchOps, device, dtype: torch.dtype) -> str | None:
    """None if every op of `ops` matches TorchOps on small random inputs (K/V writes included), else what differs."""
    g = torch.Generator().manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=g).to(device=device, dtype=dtype)  # noqa: E731
    tol = dict(rtol=1e-2, atol=1e-2) if dtype in (torch.bfloat16, torch.float16) else dict(rtol=1e-5, atol=1e-5)
    T, H, D, n_q, n_kv, S = 5, 96, 128, 4, 2, 12   # D: real models' head dim
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
    # the drafter's context rows: K/V only (n_q = 0), k norm without a q norm
    kv = qkv[:, n_q * D:].contiguous()
    caches = [[torch.zeros(n_kv, S, D, device=device, dtype=dtype) for _ in range(2)] for _ in range(2)]
    for o, c in zip((ops, TORCH_OPS), caches):
        o.qkv_rope(kv, 0, n_kv, None, kw, 1e-6, cos, sin, *c, start)
    checks["qkv_rope(k only)"] = (tuple(caches[0]), tuple(caches[1]))
    for name, (got, want) in checks.items():
        try:
            torch.testing.assert_close(got, want, **tol)
        except AssertionError as e:
            return f"{name}: {str(e).splitlines()[0]}"
    return None


def compile_self_test(ops: TorchOps, device, dtype: torch.dtype) -> int:
    """Compile the Triton variants self_test launches at once (kernels/warm.py, a thread per variant) rather than
    one after another as it runs them: it opens a process's first round on a fresh cache. Returns the launches."""
    from ddtree_bench.engine.gpu.kernels.warm import warm

    return warm(lambda: self_test(ops, device, dtype), device, per="variant")


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
            compile_self_test(TritonOps(), dev, dtype)
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
