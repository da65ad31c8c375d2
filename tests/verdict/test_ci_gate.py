"""ddtree-bench gates itself: the bundled toy pair's DDTree and DFlash runs, in-process and through
a real `ddtree-bench serve` process, must match the stored greedy baseline (baselines/toy-smoke.jsonl)
under `.ci/gate.yaml`. This is what a user's CI does with their deployment, run with our CLI
exactly as documented in docs/ci-gate.md. CI_ARTIFACTS=DIR keeps the JUnit and markdown verdicts.
`run` and `gate` call the CLI's main in this process (`cli_in_process`, torch on one thread); the
server is a real `ddtree-bench serve` process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from engine_support import one_torch_thread  # noqa: F401 (fixture)
from process_support import cli_in_process as cli

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "baselines" / "toy-smoke.jsonl"
RULES = ROOT / ".ci" / "gate.yaml"
CLI = [sys.executable, "-m", "ddtree_bench"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def gate(capsys, run_dir: Path, tmp: Path, name: str) -> None:
    out = Path(os.environ.get("CI_ARTIFACTS", tmp))
    out.mkdir(parents=True, exist_ok=True)
    junit, md = out / f"gate-{name}.xml", out / f"gate-{name}.md"
    p = cli(capsys, "gate", str(run_dir), "--baseline", str(BASELINE), "--rules", str(RULES), "--junit", str(junit),
            "--markdown", str(md), check=False)
    assert p.returncode == 0, f"gate failed for {name}:\n{p.stdout}\n{p.stderr}"
    suite = ET.parse(junit).getroot()
    assert int(suite.get("failures", 0)) == 0 and int(suite.get("tests", 0)) > 0


@pytest.mark.slow
@pytest.mark.parametrize("method,extra", [("ddtree", ()), ("dflash", ()), ("ddtree", ("--cuda-graphs",))])
def test_in_process_runs_match_the_stored_baseline(tmp_path, capsys, method, extra):
    """Plain loop and the fixed-shape fast loop (uncaptured on a CPU) alike."""
    name = f"inprocess-{method}" + ("-fastloop" if extra else "")
    run = tmp_path / name
    cli(capsys, "run", "--model", "toy", "--method", method, "--budget", "64", "--suite", "smoke", "--max-new-tokens", "64",
        "--out", str(run), "--quiet", *extra)
    gate(capsys, run, tmp_path, name)


@pytest.mark.slow
def test_served_runs_match_the_stored_baseline(tmp_path, capsys):
    server = subprocess.Popen(CLI + ["serve", "--model", "toy", "--method", "ddtree", "--budget", "64", "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV, cwd=ROOT)
    try:
        url = None
        for line in server.stdout:
            m = re.search(r"ready at (http://[0-9.:]+)", line)
            if m:
                url = m.group(1)
                break
        assert url, "ddtree-bench serve did not become ready"
        run = tmp_path / "served"
        cli(capsys, "run", "--backend", "standalone", "--url", url, "--suite", "smoke", "--max-new-tokens", "64",
            "--concurrency", "2", "--out", str(run), "--quiet")
        gate(capsys, run, tmp_path, "standalone-ddtree")
    finally:
        server.terminate()
        server.wait(timeout=30)
