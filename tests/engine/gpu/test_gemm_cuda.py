"""The few-row weight GEMM on a GPU at the Qwen3-8B projections' real shapes in bf16: every launch shape the
table (gemm.config: the H200 table, or DDTREE_GEMM_TABLE's) picks, and a split and an unsplit shape of
every band, against cuBLAS (F.linear; the fused SiLU-mul for gate/up), eager and replayed from a CUDA graph.
Skips without CUDA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ddtree_bench.engine.gpu.fused import TORCH_OPS
from ddtree_bench.engine.gpu.kernels import gemm
from ddtree_bench.engine.gpu.kernels.gemm import GemmConfig

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROJ = {"qkv": (6144, 4096, False), "o_proj": (4096, 4096, False), "gate_up": (12288, 4096, True),
        "down": (4096, 12288, False), "lm_head": (151936, 4096, False)}


def _launches(M, N, K, sw):
    out = [GemmConfig(16 if M <= 16 else min(128, 1 << (M - 1).bit_length()), 64, 128, s, 4, 3) for s in (1, 3)]
    picked = gemm.config(M, N, K, torch.bfloat16, "cuda", swiglu=sw)
    return out + ([picked] if picked is not None else [])


@pytest.mark.parametrize("name", list(PROJ))
@pytest.mark.parametrize("M", [1, 16, 17, 64, 129, 256])
def test_bf16_gemm_matches_cublas_at_the_8b_shapes(name, M):
    N, K, sw = PROJ[name]
    g = torch.Generator(device="cuda").manual_seed(M)
    x = torch.randn(M, K, device="cuda", generator=g).bfloat16()
    w = (torch.randn(2 * N if sw else N, K, device="cuda", generator=g) / K ** 0.5).bfloat16()
    want = (TORCH_OPS.silu_mul(F.linear(x, w)) if sw else F.linear(x, w)).float()
    op = gemm.swiglu if sw else gemm.linear
    for c in _launches(M, N, K, sw):
        got = op(x, w, c).float()
        # one bf16 rounding apart (and the SiLU's rounding on top for gate/up)
        torch.testing.assert_close(got, want, rtol=2e-2, atol=3e-2, msg=lambda m: f"{c}: {m}")
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            out = op(x, w, c)
        x.copy_(torch.randn(M, K, device="cuda", generator=g).bfloat16())
        gr.replay()
        torch.testing.assert_close(out.float(), (TORCH_OPS.silu_mul(F.linear(x, w)) if sw else F.linear(x, w)).float(),
                                   rtol=2e-2, atol=3e-2)
