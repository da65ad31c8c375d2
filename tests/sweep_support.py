"""Shared by the parallel-sweep tests (tests/sweep/test_parallel.py, `--workers`) and the Ray tests
(tests/sweep/test_ray.py, `--executor ray`): the grid both run, its serial sweep (what both must
reproduce; run once per session, in this process, and shared), and the digest of a sweep directory
that must equal serial.

Knows the sweep's result layout (summary.csv, points/<id>/); nothing of workers or Ray.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtree_bench.results import read_records
from process_support import csv_rows, run_cli

# in-process and `ddtree-bench serve` groups of the random pair: 4 points, each a server group
GRID = ["--backends", "inprocess,standalone", "--models", "random", "--suites", "smoke", "--methods", "ddtree",
        "--budgets", "4", "--limit", "2", "--max-new-tokens", "8", "--no-report", "-q"]
_SERIAL: list[Path] = []


@pytest.fixture(scope="module")
def serial(tmp_path_factory) -> Path:
    """GRID swept serially (the default executor), once per session; the directory is only read."""
    if not _SERIAL:
        out = tmp_path_factory.mktemp("serial") / "sw"
        assert run_cli(["sweep", *GRID, "--out", str(out)]) == 0
        _SERIAL.append(out)
    return _SERIAL[0]


def results(out: Path) -> dict[str, tuple]:
    """What must equal serial: per point, its status, tau (mean and token-weighted), the files it has
    and every output."""
    out_ = {}
    for r in csv_rows(out):
        d = out / "points" / r["point_id"]
        recs = sorted(read_records(d), key=lambda x: (x.prompt_id, x.turn)) if r["status"] == "ok" else []
        out_[r["point_id"]] = (r["status"], r["acceptance_length_mean"], r["acceptance_length_token_weighted"],
                               sorted(f.name for f in d.iterdir()),
                               [(x.prompt_id, x.turn, x.output_ids, x.output_text, x.accept_lengths) for x in recs])
    return out_
