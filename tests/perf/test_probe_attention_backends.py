"""benchmarks/gpu_probe_attention_backends.py end to end on a CPU under Triton's interpreter (float32, one layer, no
timing): the engine's tree kernel over prefix + tree and over the tree alone (moved to slots 0..n-1, prefix 0)
both equal the float32 math reference of their part, and so does SDPA over the prefix alone; the backends a CPU
lacks are named on their own line instead of ending the run. The split's arithmetic rests on these parts being
the right ones."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_probe_attention_backends.py"
pytest.importorskip("triton", reason="the probe's tree columns run kernels/tree_attention.py, which needs Triton")


def test_each_part_equals_its_reference_and_missing_backends_are_named():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(SCRIPT.parents[1])}
    r = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--dtype", "float32", "--tokens", "9,20",
                        "--layers", "1", "--prefix", "64"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    rows = {int(m.group(1)): m.group(2).split() for m in re.finditer(r"^\s+(\d+)\s+(ran .*)$", r.stdout, re.M)}
    assert sorted(rows) == [9, 20], r.stdout
    header = re.search(r"^\s+n\s+(.*?)\s+split", r.stdout, re.M).group(1).split()
    for n, cells in rows.items():
        # cells come as "ran (err)" pairs or "-"; pair them back up with the header's columns
        vals, i = {}, 0
        for col in header:
            if cells[i] == "-":
                vals[col], i = None, i + 1
            else:
                vals[col], i = float(cells[i + 1].strip("()")), i + 2
        for col in ("tree", "tree-only", "prefix/flash"):
            assert vals[col] is not None and vals[col] < 1e-4, (n, col, r.stdout)
    # the CUDA-only backends fail on a CPU, each on its own line, and the run goes on to the next n
    assert len(re.findall(r"^\s+prefix/cudnn: RuntimeError", r.stdout, re.M)) == 2, r.stdout
