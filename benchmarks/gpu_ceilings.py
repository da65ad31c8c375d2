#!/usr/bin/env python3
"""What the verify would cost with a part of it gone: ceilings for issue 35's item 2, timed in one process.

Item 2 asks the verify for <= 1.15x its GEMM-only floor at every n. Before building a lever (a new attention kernel,
norms folded away), this times the forward with that part removed, so the most the lever can buy is measured, not
estimated from kernel sums. Arms, each a patch active while its graph is captured (benchmarks/gpu_verify_ab.py's
harness, perf/knob_ab.run_ab, with the GEMM-only floor in the same round-robin):
* `default`: the engine's forward;
* `nonorm`: o_proj and down, where they run on cuBLAS, add into the residual in cuBLAS's epilogue (x.addmm_, beta = 1)
  and the next RMSNorm is skipped: the next GEMM reads a fixed standard-normal tensor of h's shape (made in the
  capture's warmup) - the bound on folding each norm's weight into the next GEMM's weights and its 1 / rms into the
  layer op after that GEMM (qkv_rope, the SiLU-mul), which would compute it from x. Where the projection runs on the
  Triton GEMM its add + norm kernel stays (it also sums the split-K partials);
* `nonorm_all`: the same with every o_proj and down on cuBLAS (a fold that gives up the Triton GEMM there);
* `nonorm_raw`: `nonorm` with the next GEMM reading the unnormalised residual itself (h = x): not the fold's bound,
  since the GEMMs time differently on those values (the first run of this script, whose `nonorm` this was, beat the
  GEMM-only floor at n = 512 / 1024: docs/gpu-performance.md, "2026-12-07 05:20-07:00 UTC"); kept to show it;
* `noattn`: attention returns q's rows as its output (one copy kernel instead of the attention and its combine):
  the bound on any attention work;
* `both`: the two together.
The patched arms compute the wrong function by design: their logits differ (max |dlogit| is printed and means
nothing) and only their times count. The patches live here, never in the engine.

  python3 benchmarks/gpu_ceilings.py --tokens 1,16,64,128,256,512,1024 --rounds 5 --out /tmp/ceil.json
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch   # noqa: E402

from ddtree_bench.engine.gpu import forward   # noqa: E402
from ddtree_bench.engine.gpu.ops import TorchOps, blas_library, lt_gemms   # noqa: E402

ARMS = ["default", "nonorm CEIL_SKIP=norm", "nonorm_all CEIL_SKIP=norm,anygemm", "nonorm_raw CEIL_SKIP=norm,raw",
        "noattn CEIL_SKIP=attn", "both CEIL_SKIP=norm,attn"]
_NORMAL: dict[tuple, torch.Tensor] = {}   # (shape, dtype, device) -> the fixed input `nonorm` hands the next GEMM


def _skips() -> set[str]:
    return set(filter(None, os.environ.get("CEIL_SKIP", "").split(",")))


def _normal_like(x: torch.Tensor) -> torch.Tensor:
    """A fixed standard-normal tensor like x (made on first use: in a capture's eager warmup, not in the graph)."""
    key = (tuple(x.shape), x.dtype, x.device)
    if key not in _NORMAL:
        g = torch.Generator(device=x.device).manual_seed(0)
        _NORMAL[key] = torch.randn(x.shape, generator=g, device=x.device).to(x.dtype)
    return _NORMAL[key]


def _on_cublas(ops: TorchOps, inner, w, b) -> bool:
    """Whether ops runs this projection through cuBLAS (the twin always; TritonOps where its GEMM table has none)."""
    return not hasattr(ops, "_gemm") or ops._gemm(inner, w, b, w.shape[0], False) is None


def patch() -> None:
    """Install the arms' patches on TorchOps / TritonOps and forward._attend (read CEIL_SKIP at capture time)."""
    from ddtree_bench.engine.gpu.kernels.layer_ops import TritonOps

    def wrap(cls):
        real = cls.linear_add_rmsnorm

        def linear_add_rmsnorm(self, x, inner, w, b, norm_w, eps):
            skips = _skips()
            if "norm" in skips and b is None and ("anygemm" in skips or _on_cublas(self, inner, w, b)):
                if x.is_cuda and lt_gemms(x.device):
                    with blas_library("cublaslt"):
                        x.addmm_(inner, w.t())
                else:
                    x.addmm_(inner, w.t())
                return x, (x if "raw" in skips else _normal_like(x))
            return real(self, x, inner, w, b, norm_w, eps)
        cls.linear_add_rmsnorm = linear_add_rmsnorm

    wrap(TorchOps)
    wrap(TritonOps)
    real_attend = forward._attend

    def attend(ops, attention, q, k, v, bias, live, prefix, tree=None):
        if "attn" in _skips():
            one = q[None] if q.dim() == 3 else q
            C, Hq, T, D = one.shape
            return one.transpose(1, 2).reshape(C * T, Hq * D)
        return real_attend(ops, attention, q, k, v, bias, live, prefix, tree)
    forward._attend = attend


def main(argv: list[str] | None = None) -> int:
    import gpu_verify_ab

    patch()
    argv = list(sys.argv[1:] if argv is None else argv)
    arms = [] if "--arm" in argv else [x for name in ARMS for x in ("--arm", name)]
    return gpu_verify_ab.main(["--gemm-only", *arms, *argv])


if __name__ == "__main__":
    sys.exit(main())
