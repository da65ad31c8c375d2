"""What a results file records about where it was made (ddtree_bench/env.py): the kernel knobs a run was made
with, so that two bench-engine files whose GPU kernels differ say so."""

from __future__ import annotations

from ddtree_bench.engine.gpu.kernels.experimental import KNOBS
from ddtree_bench.env import engine_knobs, environment


def test_the_engine_knobs_are_recorded_as_set_and_left_out_when_unset(monkeypatch):
    monkeypatch.delenv("DDTREE_GPU_EXPERIMENTAL", raising=False)
    monkeypatch.delenv("DDTREE_GEMM_TABLE", raising=False)
    for knob in KNOBS:
        monkeypatch.delenv(f"DDTREE_{knob}", raising=False)
    assert environment()["engine_knobs"] == {}
    monkeypatch.setenv("DDTREE_GPU_EXPERIMENTAL", "pdl,split-cap")
    monkeypatch.setenv("DDTREE_GEMM_TABLE", "tables/h100.json")
    assert engine_knobs() == {"DDTREE_GPU_EXPERIMENTAL": "pdl,split-cap", "DDTREE_GEMM_TABLE": "tables/h100.json"}
    monkeypatch.setenv("DDTREE_GEMM_TABLE", "")
    assert engine_knobs() == {"DDTREE_GPU_EXPERIMENTAL": "pdl,split-cap"}
    monkeypatch.setenv("DDTREE_TREE_RANGES", "8")   # an A/B knob moves kernels as much as a feature does
    monkeypatch.setenv("DDTREE_NOT_A_KNOB", "1")
    assert engine_knobs() == {"DDTREE_GPU_EXPERIMENTAL": "pdl,split-cap", "DDTREE_TREE_RANGES": "8"}
