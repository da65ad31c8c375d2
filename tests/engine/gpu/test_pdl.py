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


@pytest.mark.parametrize("mode, prefetch, late", [("pdl", True, False), ("pdl-bare", False, False),
                                                  ("pdl-late", False, True)])
def test_each_mode_turns_pdl_on_with_its_own_prefetch_and_launch_point(monkeypatch, mode, prefetch, late):
    """Only "pdl" prefetches weights into L2; only "pdl-late" lets the next kernel in after the main loop. Where PDL
    cannot run (a CPU), the launch keywords keep every instruction out, whatever the mode."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv(experimental.ENV, mode)
    assert pdl.requested() and pdl.late() is late
    assert pdl.gdc_options("cpu") == {"USE_GDC": False, "GDC_LATE": False, "launch_pdl": False}
    assert not pdl.prefetch("cpu")
    monkeypatch.setattr(pdl, "SUPPORTED", True)
    monkeypatch.setattr(pdl, "_sm90_or_newer", lambda device: device.startswith("cuda"))
    assert pdl.gdc_options("cuda") == {"USE_GDC": True, "GDC_LATE": late, "launch_pdl": True}
    assert pdl.prefetch("cuda") is prefetch
    monkeypatch.setenv(experimental.ENV, "split-cap")
    assert pdl.gdc_options("cuda") == {"USE_GDC": False, "GDC_LATE": False, "launch_pdl": False}
