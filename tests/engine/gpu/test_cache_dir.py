"""Where compiled Triton kernels persist (engine/gpu/kernels/cache_dir.py): the user's TRITON_CACHE_DIR
wins, then the project's cache dir ($DDTREE_BENCH_CACHE_DIR, $XDG_CACHE_HOME/ddtree-bench, the default),
and every results file records the directory a run used."""

from __future__ import annotations

import os
from pathlib import Path

from ddtree_bench import defaults as D
from ddtree_bench.engine.gpu.kernels.cache_dir import triton_cache_dir, use_project_cache


def test_the_rule_in_order():
    assert triton_cache_dir({"TRITON_CACHE_DIR": "/x/t", "DDTREE_BENCH_CACHE_DIR": "/p", "XDG_CACHE_HOME": "/c"}) == Path("/x/t")
    assert triton_cache_dir({"DDTREE_BENCH_CACHE_DIR": "/p", "XDG_CACHE_HOME": "/c"}) == Path("/p/triton")
    assert triton_cache_dir({"XDG_CACHE_HOME": "/c"}) == Path("/c/ddtree-bench/triton")
    assert triton_cache_dir({}) == Path(D.CACHE_DIR).expanduser() / "triton"
    assert triton_cache_dir({"TRITON_CACHE_DIR": "", "DDTREE_BENCH_CACHE_DIR": ""}) == Path(D.CACHE_DIR).expanduser() / "triton"


def test_use_project_cache_sets_triton_s_variable_only_when_unset(monkeypatch, tmp_path):
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("DDTREE_BENCH_CACHE_DIR", str(tmp_path))
    assert use_project_cache() == str(tmp_path / "triton") == os.environ["TRITON_CACHE_DIR"]
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    assert use_project_cache() == str(tmp_path / "mine") == os.environ["TRITON_CACHE_DIR"]


def test_importing_the_kernels_points_triton_at_the_project_cache_and_results_record_it(tmp_path):
    import subprocess
    import sys

    code = ("import os; import ddtree_bench.engine.gpu.kernels.common; from ddtree_bench.env import environment; "
            "print(os.environ['TRITON_CACHE_DIR']); print(environment()['triton_cache_dir'])")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_CACHE_DIR"}
    env["DDTREE_BENCH_CACHE_DIR"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == [str(tmp_path / "triton")] * 2
