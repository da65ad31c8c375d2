"""benchmarks/gemm_table_bands.py: the table it writes is the built-in one with only the named projections' bands
above --above replaced (read back through DDTREE_GEMM_TABLE's own parser), and bad specs exit 2 with one line and
no file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ddtree_bench.engine.gpu.kernels import gemm
from ddtree_bench.engine.gpu.kernels.gemm_parts import GemmConfig

ROOT = Path(__file__).resolve().parents[2]
GATE_UP, LM_HEAD, DOWN = (12288, 4096, True), (151936, 4096, False), (4096, 12288, False)


def _run(tmp_path, *args):
    return subprocess.run([sys.executable, "benchmarks/gemm_table_bands.py", "--base", "h100", "--out",
                           str(tmp_path / "t.json"), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_only_the_named_bands_above_the_edge_change(tmp_path):
    r = _run(tmp_path, "--above", "64", "--set", "gate_up:96=cublas,128=64x64x128/1/4/4",
             "--set", "lm_head:128=128x128x128/1/4/3")
    assert r.returncode == 0, r.stderr
    t = gemm.table_from_json(json.loads((tmp_path / "t.json").read_text()))
    at = lambda key, m: gemm.lookup(t, m, *key)  # noqa: E731
    base = lambda key, m: gemm.lookup(gemm.H100_TABLE, m, *key)  # noqa: E731
    for m in (1, 16, 17, 32, 64):   # kept
        assert at(GATE_UP, m) == base(GATE_UP, m) and at(LM_HEAD, m) == base(LM_HEAD, m)
    assert at(GATE_UP, 65) is None and at(GATE_UP, 96) is None
    assert at(GATE_UP, 97) == at(GATE_UP, 128) == GemmConfig(64, 64, 128, 1, 4, 4)
    assert at(LM_HEAD, 65) == GemmConfig(128, 128, 128, 1, 4, 3)
    assert at(GATE_UP, 129) is None and at(LM_HEAD, 129) is None   # above the last band: cuBLAS
    assert t[DOWN] == gemm.H100_TABLE[DOWN]   # not named: untouched


def test_bad_specs_exit_2_with_one_line_and_no_file(tmp_path):
    for spec in ("gate:96=cublas", "gate_up:96=12x64x128/1/4/4", "gate_up:96=64x64", "gate_up:32=cublas"):
        r = _run(tmp_path, "--above", "64", "--set", spec)
        assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "gemm_table_bands:" in r.stderr, spec
        assert not (tmp_path / "t.json").exists() and not list(tmp_path.iterdir())
