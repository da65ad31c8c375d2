"""Failures told at once on a device call: with DDTREE_TESTS_INSTAFAIL=1 each failing test's id and the first line
of its error go to stderr the moment it fails, not in pytest's summary at the end, which a call's time limit
can cut off (benchmarks/gpu_gemm.sh sets it; nothing changes without it)."""

from __future__ import annotations

import os
import sys


def pytest_runtest_logreport(report):
    if not report.failed or os.environ.get("DDTREE_TESTS_INSTAFAIL") != "1":
        return
    crash = getattr(report.longrepr, "reprcrash", None)
    first = (crash.message if crash is not None else str(report.longrepr)).strip().splitlines()
    print(f"\nFAILED {report.nodeid} ({report.when}): {first[0] if first else '?'}", file=sys.stderr, flush=True)
