"""Helpers the sweep and process tests share: run the CLI in-process, read summary.csv, watch processes.

Knows /proc and the CLI entry point; nothing of any one test's grid.
"""

from __future__ import annotations

import csv
import time
from pathlib import Path


def run_cli(argv) -> int:
    """`ddtree-bench ARGV` in this process; its exit code."""
    from ddtree_bench.cli import main

    try:
        main(argv)
    except SystemExit as e:
        return e.code
    return 0


def csv_rows(out: Path) -> list[dict]:
    with open(out / "summary.csv", newline="") as f:
        return list(csv.DictReader(f))


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_for(pred, timeout_s: float = 240.0, step_s: float = 0.1):
    """Poll `pred` until it returns something truthy (returned) or `timeout_s` passes (its last value)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step_s)
    return pred()
