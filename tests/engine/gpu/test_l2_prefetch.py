"""kernels/l2_prefetch.py ("l2-prefetch" in DDTREE_GPU_EXPERIMENTAL): off unless named; never on a CPU or under
Triton's interpreter (no inline PTX there), even when named; and on CUDA a captured bf16 verify forward with
o_proj's weight prefetched on a parallel branch gives the same logits and cache, bit for bit, as without (the
fork is joined inside the capture, or the capture would fail)."""

from __future__ import annotations

import pytest
import torch

from ddtree_bench.engine.gpu.kernels import experimental, l2_prefetch


@pytest.mark.parametrize("flag", ["", "l2-prefetch"])
def test_nothing_launches_on_a_cpu_whatever_the_flag(monkeypatch, flag):
    monkeypatch.setenv(experimental.ENV, flag)
    w = torch.zeros(64, 64)
    assert experimental.enabled("l2-prefetch") == bool(flag)
    assert not l2_prefetch.enabled(w) and l2_prefetch.start(w) is None
    l2_prefetch.join(None)


def test_the_interpreter_never_launches_it(monkeypatch):
    monkeypatch.setenv(experimental.ENV, "l2-prefetch")
    monkeypatch.setenv("TRITON_INTERPRET", "1")

    class CudaLike:   # what enabled() asks of a weight, as a CUDA tensor would answer
        is_cuda = True

        @staticmethod
        def is_contiguous():
            return True

    assert not l2_prefetch.enabled(CudaLike())
    monkeypatch.delenv("TRITON_INTERPRET")
    assert l2_prefetch.enabled(CudaLike()) == (l2_prefetch.triton is not None)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_captured_forward_with_the_prefetch_has_the_same_bits_as_without(monkeypatch):
    from ddtree_bench.engine.gpu import fused

    from captured_forward_support import captured_verify

    odd = torch.randn(1000, 33, device="cuda").bfloat16()   # a line count that is not a multiple of BLOCK
    monkeypatch.setenv(experimental.ENV, "l2-prefetch")
    l2_prefetch.join(l2_prefetch.start(odd))
    torch.cuda.synchronize()
    (l0, k0), (l1, k1) = (captured_verify(monkeypatch, flag, 6, fused.TritonOps()) for flag in ("", "l2-prefetch"))
    assert torch.equal(l0, l1) and torch.equal(k0, k1)


def test_the_programs_knob(monkeypatch):
    monkeypatch.delenv("DDTREE_L2_PREFETCH_PROGRAMS", raising=False)
    assert l2_prefetch.programs_wanted() == l2_prefetch.PROGRAMS
    monkeypatch.setenv("DDTREE_L2_PREFETCH_PROGRAMS", "64")
    assert l2_prefetch.programs_wanted() == 64
    from ddtree_bench.errors import UsageError

    for bad in ["0", "-3", "many"]:
        monkeypatch.setenv("DDTREE_L2_PREFETCH_PROGRAMS", bad)
        with pytest.raises(UsageError):
            l2_prefetch.programs_wanted()
