"""kernels/normalisers.py against its twin, tree_vector.logprobs_at(fp32_logits(x), ids): the max (NaN as -inf, a
max of +-inf counted as 0), the shifted exp, each slot's own sum, inf / NaN / all -inf rows, one slot and several.
On CUDA the log-probs must be the twin's bits (exact_here holds on the GPU the engine runs on); under the CPU
interpreter the exp is numpy's, not libdevice's, so there they must agree within an ulp and exact_here must say
whether the bits are the same. Runs on CUDA, and in CI under Triton's interpreter (test_triton_interpreter.py)."""

from __future__ import annotations

import pytest
import torch

from ddtree_bench.engine.tree_vector import fp32_logits, logprobs_at as twin

from triton_support import DEV, triton_only

pytestmark = [pytest.mark.gpu, triton_only]


def _check(got: torch.Tensor, want: torch.Tensor) -> None:
    if DEV == "cuda":
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    else:
        assert torch.equal(torch.isinf(got), torch.isinf(want)) and torch.equal(got.isneginf(), want.isneginf())
        fin = torch.isfinite(want)
        torch.testing.assert_close(got[fin], want[fin], rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float32] + ([torch.bfloat16] if DEV == "cuda" else []))
@pytest.mark.parametrize("C", [0, 1, 3])   # 0: one slot without the slot axis ([L, V], the single loop's shape)
def test_log_probs_equal_the_twin_with_each_slots_sum_on_its_own_rows(dtype, C):
    from ddtree_bench.engine.gpu.kernels.normalisers import logprobs_at

    L, V, K = 5, 5000 if DEV == "cuda" else 700, 7   # V over one 4096-token step on CUDA: the max runs over steps
    g = torch.Generator().manual_seed(C)
    x = torch.randn(max(C, 1), L, V, generator=g) * 4
    x[0, 1, 3] = float("nan")        # NaN reads as -inf, everywhere
    x[0, 2, 5] = float("inf")        # a +inf max counts as 0: exp(inf - 0) = inf, the row's log-probs -inf / NaN -> -inf
    x[-1, 3] = -float("inf")         # an all -inf row: normaliser -inf, log-probs -inf
    x = x.to(DEV, dtype)
    ids = torch.stack([torch.randperm(V, generator=g)[:K] for _ in range(max(C, 1) * L)]).view(max(C, 1), L, K)
    ids[0, 1, 0], ids[0, 2, 0] = 3, 5
    ids = ids.to(DEV)
    if C == 0:
        x, ids = x[0], ids[0]
    _check(logprobs_at(x, ids), twin(fp32_logits(x), ids))


def test_shifted_exp_rows_hold_the_twins_max_and_exp():
    """One launch for every row: m = the row max with NaN as -inf and +-inf as 0, e = exp(x - m) (numpy's exp under
    the interpreter, so within an ulp there)."""
    from ddtree_bench.engine.gpu.kernels.normalisers import shifted_exp

    x = torch.randn(4, 9000 if DEV == "cuda" else 300, generator=torch.Generator().manual_seed(1)) * 5
    x[1, 7] = float("nan")
    x[2, :] = -float("inf")
    x[3, 11] = float("inf")
    e, m = shifted_exp(x.to(DEV))
    logits = fp32_logits(x.to(DEV))   # the twin on the same device: the exp's bits are the device's
    want_m = logits.amax(dim=-1, keepdim=True)
    want_m = want_m.masked_fill(want_m.abs() == float("inf"), 0.0)
    assert torch.equal(m, want_m)
    want = (logits - want_m).exp()
    if DEV == "cuda":
        assert torch.equal(e, want)
    else:
        torch.testing.assert_close(e, want, rtol=2e-7, atol=0)


def test_exact_here_checks_the_probe_rows_once_and_says_whether_the_bits_agree():
    """On CUDA it must hold for bf16 and fp32 (else the batched builder silently loses the fused pass); under the
    interpreter it answers by comparing bits, and it is cached per (device, dtype)."""
    from ddtree_bench.engine.gpu.kernels import normalisers

    x = normalisers.probe_logits(torch.float32, "cpu")
    assert x.shape == (3, 15, 4096) and x[0, 0].isposinf().any() and x[0, 1].isnan().any() and x[0, 2].isneginf().all()
    maxima = x[1:].abs().amax(dim=-1).flatten()
    assert maxima.min() < 0.5 and maxima.max() > 1e4   # rows spread over exp's range
    normalisers.exact_here.cache_clear()
    dts = [torch.float32] + ([torch.bfloat16] if DEV == "cuda" else [])
    got = [normalisers.exact_here(DEV, dt) for dt in dts]
    if DEV == "cuda":
        assert got == [True] * len(dts)
    assert normalisers.exact_here.cache_info().misses == len(dts)
    assert [normalisers.exact_here(DEV, dt) for dt in dts] == got and normalisers.exact_here.cache_info().hits == len(dts)
