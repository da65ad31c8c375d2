"""When the kernels launch with programmatic dependent launch (engine/gpu/kernels/pdl.py): only when named in
DDTREE_GPU_EXPERIMENTAL (kernels/experimental.py), only on CUDA, never under Triton's interpreter; a name
that is no feature is a usage error."""

from __future__ import annotations

import pytest

from ddtree_bench.engine.gpu.kernels import experimental, pdl
from ddtree_bench.errors import UsageError


@pytest.mark.parametrize("value", [None, "", "split-cap", " , "])
def test_pdl_is_off_unless_named(monkeypatch, value):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if value is None:
        monkeypatch.delenv(experimental.ENV, raising=False)
    else:
        monkeypatch.setenv(experimental.ENV, value)
    assert not pdl.enabled("cpu")
    assert not pdl.enabled("cuda")   # off by default even where a GPU is: it has not run on one yet


def test_pdl_needs_cuda_and_a_compiler(monkeypatch):
    monkeypatch.setenv(experimental.ENV, "split-cap, pdl")
    assert experimental.enabled("pdl") and experimental.enabled("split-cap")
    assert not pdl.enabled("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not pdl.enabled("cuda")


def test_an_unknown_feature_is_a_usage_error_naming_the_known_ones(monkeypatch):
    monkeypatch.setenv(experimental.ENV, "pdl,turbo")
    with pytest.raises(UsageError, match="unknown feature.*turbo.*known: pdl, split-cap, tree-fold"):
        experimental.enabled("pdl")
