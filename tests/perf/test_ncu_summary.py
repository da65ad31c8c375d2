"""benchmarks/ncu_summary.py on an excerpt of a real Nsight Compute report (tests/data/ncu_excerpt.txt: the tree
attention kernel and one cuBLAS GEMM of an H100 verify layer): one row per kernel with the figures ncu printed, and
exit 2 with one line for a file it cannot read or that holds no ncu kernel section."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import ncu_summary  # noqa: E402


def test_each_kernel_section_becomes_one_row_with_its_figures():
    rows = ncu_summary.parse((ROOT / "tests/data/ncu_excerpt.txt").read_text())
    assert [r["kernel"] for r in rows] == ["_tree_attn_kernel", "nvjet_sm90_tst_64x64_64x13_2x1_v_bz_TNT"]
    tree, gemm = rows
    assert (tree["grid"], tree["us"], tree["dram%"], tree["issue%"], tree["regs"], tree["smem"]) == \
        ("8x8x3", "15.10", "11.53", "18.68", "214", "81.92")
    assert (tree["occ%"], tree["ach%"], tree["cpi"]) == ("12.50", "8.19", "5.67")
    assert tree["stall"] == "long scoreboard (L1TEX) 1.9" and gemm["stall"] == "long scoreboard (L1TEX) 10.2"
    assert gemm["dram%"] == "64.25" and gemm["smem"] == "229.77"


def test_a_missing_or_foreign_file_exits_2_with_one_line(tmp_path):
    binary = tmp_path / "report.txt"
    binary.write_bytes(bytes(range(256)) * 4)
    for path in ("no/such/report.txt", str(binary)):
        r = subprocess.run([sys.executable, "benchmarks/ncu_summary.py", path], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and path in r.stderr and not r.stdout
