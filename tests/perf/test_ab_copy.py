"""benchmarks/ab_copy.sh: a copy of the package at a revision, small enough to carry (large data files left out),
filled back and checked where it runs; a copy without its suites (what `git archive REV ddtree_bench` alone gives)
is refused before any A/B spends time on it."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _sh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "benchmarks/ab_copy.sh", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_make_leaves_out_the_weights_and_fill_brings_them_back_and_checks_the_copy(tmp_path):
    dest = tmp_path / "copy"
    made = _sh("make", "HEAD", str(dest))
    assert made.returncode == 0, made.stderr
    weights = Path("models") / "toy" / "target" / "model.safetensors"
    assert (dest / "suites" / "gsm8k.yaml").exists() and not (dest / "ddtree_bench" / weights).exists()
    filled = _sh("fill", str(dest))
    assert filled.returncode == 0 and f"ab_copy: {dest} ready" in filled.stdout, filled.stdout + filled.stderr
    assert (dest / "ddtree_bench" / weights).read_bytes() == (ROOT / "ddtree_bench" / weights).read_bytes()
    again = _sh("make", "HEAD", str(dest))
    assert again.returncode == 1 and "exists; remove it first" in again.stderr


def test_a_copy_without_its_suites_is_refused(tmp_path):
    dest = tmp_path / "copy"
    dest.mkdir()
    archive = subprocess.run(["git", "archive", "HEAD", "ddtree_bench"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    r = _sh("fill", str(dest))
    assert r.returncode == 1 and "does not list the gsm8k suite" in r.stderr
    assert _sh("fill", str(tmp_path / "nothing")).returncode == 1
