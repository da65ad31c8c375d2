"""The live-slot attention inside a captured CUDA graph: one capture stays right as the prefix grows
(the kernel reads the live length from the device each replay), at the real head dim 128 and a
grouped-query layout of 4, in fp32 and bf16, against SDPA over the whole cache. Needs CUDA; skips
cleanly without it (tests/engine/gpu/test_attention_triton.py checks the kernel's values on a CPU
under Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from ddtree_bench.engine.gpu.forward import grouped_attend, visible_bias
from ddtree_bench.engine.gpu.graphs import Stage
from ddtree_bench.engine.gpu.tree_ops import verify_visible

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("T", [1, 17, 257])
def test_one_captured_graph_follows_the_growing_prefix(dtype, T):
    from ddtree_bench.engine.gpu.kernels.attention import live_attend

    dt, dev = getattr(torch, dtype), torch.device("cuda")
    Hq, Hkv, D, S = 32, 8, 128, 2048
    g = torch.Generator(device=dev).manual_seed(T)
    q = torch.randn(Hq, T, D, generator=g, device=dev).to(dt)
    k = torch.randn(Hkv, S, D, generator=g, device=dev).to(dt)
    v = torch.randn(Hkv, S, D, generator=g, device=dev).to(dt)
    anc = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
    start = torch.tensor(100, device=dev)
    bias = torch.zeros(Hq // Hkv * T, S, dtype=dt, device=dev)
    stage = Stage(lambda: live_attend(q, k, v, bias, start + T, start), dev, name="attend")
    tol = dict(rtol=1e-4, atol=1e-4) if dt == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    try:
        for p in (100, 700, 1500, S - T):
            start.fill_(p)
            bias.copy_(visible_bias(verify_visible(anc, start, S), dt, Hq // Hkv))
            got = stage.run()
            torch.testing.assert_close(got.float(), grouped_attend(q, k, v, bias).float(), **tol)
        assert stage.captured
    finally:
        stage.release()
