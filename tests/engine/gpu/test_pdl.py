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


def _pretend_tuned_card(monkeypatch, tuned: bool = True):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv(experimental.ENV, raising=False)
    monkeypatch.delenv("DDTREE_PDL_LATE_ROWS", raising=False)
    monkeypatch.setattr(pdl, "SUPPORTED", True)
    monkeypatch.setattr(pdl, "is_tuned_hopper", lambda device: tuned and str(device).startswith("cuda"))


LATE = {"USE_GDC": True, "GDC_LATE": True, "launch_pdl": True}
OFF = {"USE_GDC": False, "GDC_LATE": False, "launch_pdl": False}


def test_an_h100_or_h200_takes_pdl_late_by_default_for_few_rows_only(monkeypatch):
    """With no mode named, an H100 SXM or an H200 (common.is_tuned_hopper) launches "pdl-late" over 1..LATE_ROWS token
    rows (a decode, a draft, a B <= 32 verify, a batched DFlash step of two) and nothing above; a launch that does not
    say its rows never takes it."""
    _pretend_tuned_card(monkeypatch)
    assert not pdl.enabled("cuda")   # the named modes stay off
    for rows in (1, 16, 17, 34, pdl.LATE_ROWS):
        assert pdl.gdc_options("cuda", rows) == LATE, rows
    for rows in (pdl.LATE_ROWS + 1, 65, 1024):
        assert pdl.gdc_options("cuda", rows) == OFF, rows
    assert pdl.gdc_options("cuda") == OFF and pdl.gdc_options("cpu", 1) == OFF
    monkeypatch.setenv("DDTREE_PDL_LATE_ROWS", "16")   # the edge moves for an A/B
    assert pdl.gdc_options("cuda", 16) == LATE and pdl.gdc_options("cuda", 17) == OFF


def test_the_few_row_default_is_off_on_other_cards_under_pdl_off_and_where_pdl_cannot_run(monkeypatch):
    _pretend_tuned_card(monkeypatch, tuned=False)
    assert pdl.gdc_options("cuda", 16) == OFF   # other cards (an H100 PCIe, a GH200 ...): never timed there
    _pretend_tuned_card(monkeypatch)
    monkeypatch.setenv(experimental.ENV, "pdl-off")
    assert pdl.gdc_options("cuda", 16) == OFF
    monkeypatch.setattr(pdl, "_sm90_or_newer", lambda device: device.startswith("cuda"))
    monkeypatch.setenv(experimental.ENV, "pdl-late,pdl-off")   # off wins over a mode named beside it
    assert pdl.gdc_options("cuda", 16) == OFF and pdl.gdc_options("cuda", 1024) == OFF
    monkeypatch.delenv(experimental.ENV)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert pdl.gdc_options("cuda", 16) == OFF
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(pdl, "SUPPORTED", False)
    assert pdl.gdc_options("cuda", 16) == OFF


@pytest.mark.parametrize("mode, late", [("pdl", False), ("pdl-bare", False), ("pdl-late", True)])
def test_a_named_mode_decides_at_every_row_count(monkeypatch, mode, late):
    """A named mode overrides the default on either side of its edge: its own launch point at 1 row and at 1024."""
    _pretend_tuned_card(monkeypatch)
    monkeypatch.setattr(pdl, "_sm90_or_newer", lambda device: device.startswith("cuda"))
    monkeypatch.setenv(experimental.ENV, mode)
    for rows in (1, 1024):
        assert pdl.gdc_options("cuda", rows) == {"USE_GDC": True, "GDC_LATE": late, "launch_pdl": True}


def test_results_name_the_pdl_that_ran(monkeypatch):
    """bench-engine records pdl.describe: the few-row default with its edge on an H100 / H200, a named mode where it runs,
    "off" elsewhere (another card, pdl-off, a CPU)."""
    _pretend_tuned_card(monkeypatch)
    assert pdl.describe("cuda") == f"pdl-late up to {pdl.LATE_ROWS} rows" and pdl.describe("cpu") == "off"
    monkeypatch.setenv("DDTREE_PDL_LATE_ROWS", "16")
    assert pdl.describe("cuda") == "pdl-late up to 16 rows"
    monkeypatch.setattr(pdl, "_sm90_or_newer", lambda device: device.startswith("cuda"))
    monkeypatch.setenv(experimental.ENV, "pdl-bare")
    assert pdl.describe("cuda") == "pdl-bare" and pdl.describe("cpu") == "off"
    monkeypatch.setenv(experimental.ENV, "pdl-off")
    assert pdl.describe("cuda") == "off"
    _pretend_tuned_card(monkeypatch, tuned=False)
    assert pdl.describe("cuda") == "off"
