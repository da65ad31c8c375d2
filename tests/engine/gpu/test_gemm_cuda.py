"""The few-row weight GEMM on a GPU at the Qwen3-8B projections' real shapes in bf16: every launch shape the
table (gemm.config: the H200 table, or DDTREE_GEMM_TABLE's) picks, and a split and an unsplit shape of
every band, against cuBLAS
(F.linear; the fused SiLU-mul for gate/up), eager and replayed from a CUDA graph. Skips without CUDA."""

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
@pytest.mark.parametrize("M", [1, 2, 4, 8, 16, 17, 64, 129, 256])
def test_bf16_gemm_matches_cublas_at_the_8b_shapes(name, M):
    N, K, sw = PROJ[name]
    g = torch.Generator(device="cuda").manual_seed(M)
    x = torch.randn(M, K, device="cuda", generator=g).bfloat16()
    w = (torch.randn(2 * N if sw else N, K, device="cuda", generator=g) / K ** 0.5).bfloat16()
    for c in _launches(M, N, K, sw):
        _eager_and_replayed(x, w, sw, c, g)


def _eager_and_replayed(x, w, sw: bool, c: GemmConfig, g) -> None:
    """The launch c within a bf16 step of cuBLAS (and the SiLU's rounding on top for gate/up), eagerly and replayed
    from a CUDA graph after new values are copied into the captured x; the twin is taken after each, on x as it is."""
    op = gemm.swiglu if sw else gemm.linear
    twin = lambda: (TORCH_OPS.silu_mul(F.linear(x, w)) if sw else F.linear(x, w)).float()  # noqa: E731
    torch.testing.assert_close(op(x, w, c).float(), twin(), rtol=2e-2, atol=3e-2, msg=lambda m: f"{c}: {m}")
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        out = op(x, w, c)
    x.copy_(torch.randn(x.shape, device="cuda", generator=g).bfloat16())
    gr.replay()
    torch.testing.assert_close(out.float(), twin(), rtol=2e-2, atol=3e-2, msg=lambda m: f"{c} replayed: {m}")


@pytest.mark.parametrize("mode", ["pdl", "pdl-bare", "pdl-late"])
def test_a_fused_forward_with_pdl_has_the_same_bits_as_without(monkeypatch, mode):
    """Programmatic dependent launch (kernels/pdl.py), in each mode, only overlaps launches (and weight prefetch): a
    captured bf16 verify forward of the fused ops and GEMMs gives the same logits and cache, bit for bit."""
    from ddtree_bench.engine.gpu import fused
    from ddtree_bench.engine.gpu.kernels import pdl

    from captured_forward_support import captured_verify

    if not pdl.SUPPORTED or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs sm_90+ and a Triton with launch_pdl")
    every = lambda M, N, K, dtype, device, swiglu=False: GemmConfig(16 if M <= 16 else 32, 32, 64, 2, 4, 3)  # noqa: E731
    (l0, k0), (l1, k1) = (captured_verify(monkeypatch, flag, 5, fused.TritonOps(gemm_config=every)) for flag in ("", mode))
    assert torch.equal(l0, l1) and torch.equal(k0, k1)


@pytest.mark.parametrize("M", [17, 65, 129])
def test_cublaslt_gemms_match_cublas_replayed_and_restore_the_blas_choice(M, monkeypatch):
    """"cublaslt" (ops.TorchOps.linear through cuBLASLt): down's shape within a bf16 step of F.linear, eagerly and
    from a captured graph, and PyTorch's preferred BLAS library as it was after each call."""
    from ddtree_bench.engine.gpu.graphs import capture

    N, K, _ = PROJ["down"]
    g = torch.Generator(device="cuda").manual_seed(M)
    x = torch.randn(M, K, device="cuda", generator=g).bfloat16()
    w = (torch.randn(N, K, device="cuda", generator=g) / K ** 0.5).bfloat16()
    want = F.linear(x, w).float()
    before = torch.backends.cuda.preferred_blas_library()
    monkeypatch.setenv("DDTREE_GPU_EXPERIMENTAL", "cublaslt")
    eager = TORCH_OPS.linear(x, w).float()
    graph, out = capture(lambda: TORCH_OPS.linear(x, w))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.backends.cuda.preferred_blas_library() == before
    tol = 2 ** -7 * want.abs().amax().item()
    assert (eager - want).abs().max().item() <= tol
    assert (out.float() - want).abs().max().item() <= tol
