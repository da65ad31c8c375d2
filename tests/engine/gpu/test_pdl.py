"""When the kernels launch with programmatic dependent launch (engine/gpu/kernels/pdl.py): only when asked
(DDTREE_PDL=1), only on CUDA, never under Triton's interpreter; the kernels compile either way."""

from __future__ import annotations

import pytest

from ddtree_bench.engine.gpu.kernels import pdl


@pytest.mark.parametrize("value", [None, "0", "", "yes"])
def test_pdl_is_off_unless_asked_for(monkeypatch, value):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if value is None:
        monkeypatch.delenv(pdl.ENV, raising=False)
    else:
        monkeypatch.setenv(pdl.ENV, value)
    assert not pdl.enabled("cpu")
    assert not pdl.enabled("cuda")   # off by default even where a GPU is: it has not been measured yet


def test_pdl_needs_cuda_and_a_compiler(monkeypatch):
    monkeypatch.setenv(pdl.ENV, "1")
    assert not pdl.enabled("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not pdl.enabled("cuda")
