"""What a results file records about where it was made (ddtree_bench/env.py): the kernel knobs a run was made
with, so that two bench-engine files whose GPU kernels differ say so."""

from __future__ import annotations

from ddtree_bench.env import engine_knobs, environment


def test_the_engine_knobs_are_recorded_as_set_and_left_out_when_unset(monkeypatch):
    monkeypatch.delenv("DDTREE_GPU_EXPERIMENTAL", raising=False)
    monkeypatch.delenv("DDTREE_GEMM_TABLE", raising=False)
    assert environment()["engine_knobs"] == {}
    monkeypatch.setenv("DDTREE_GPU_EXPERIMENTAL", "pdl,split-cap")
    monkeypatch.setenv("DDTREE_GEMM_TABLE", "tables/h100.json")
    assert engine_knobs() == {"DDTREE_GPU_EXPERIMENTAL": "pdl,split-cap", "DDTREE_GEMM_TABLE": "tables/h100.json"}
    monkeypatch.setenv("DDTREE_GEMM_TABLE", "")
    assert engine_knobs() == {"DDTREE_GPU_EXPERIMENTAL": "pdl,split-cap"}
