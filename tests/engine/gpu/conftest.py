"""Failures told at once on a device call: with DDTREE_TESTS_INSTAFAIL=1 each failing test's id and the first line
of its error go to stderr the moment it fails, not in pytest's summary at the end, which a call's time limit
can cut off (benchmarks/gpu_gemm.sh sets it; nothing changes without it).

The longest compiles start first: the tests of one tree kernel at one budget share an xdist group
(test_tree_kernels_triton._kernel_shapes; `benchmarks/gpu_suite.sh` runs `--dist loadgroup`), and the largest
budgets' groups are collected ahead of every other test, largest first, so xdist hands them out in its first batch.
Collected in file order, the B = 1024 one-block group (a 139 s compile on the H200) started late and the whole
suite waited on it (2026-12-05, docs/measurements/2026-12-05/h200-g-suite). Only the order changes."""

from __future__ import annotations

import os
import re
import sys

FIRST_FROM_BUDGET = 256   # tree-kernel groups of this budget and above are collected first


def _collection_rank(item) -> int:
    """-B for a test in a tree-kernel xdist group ("tree-<kernel>-L..xV..xB<B>") of B >= FIRST_FROM_BUDGET, else 0."""
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return 0
    m = re.fullmatch(r"tree-.+xB(\d+)", str(mark.args[0] if mark.args else mark.kwargs.get("name", "")))
    return -int(m.group(1)) if m and int(m.group(1)) >= FIRST_FROM_BUDGET else 0


def pytest_collection_modifyitems(config, items):
    items.sort(key=_collection_rank)   # stable: each group's tests keep their order, the rest keep file order


def pytest_runtest_logreport(report):
    if not report.failed or os.environ.get("DDTREE_TESTS_INSTAFAIL") != "1":
        return
    crash = getattr(report.longrepr, "reprcrash", None)
    first = (crash.message if crash is not None else str(report.longrepr)).strip().splitlines()
    print(f"\nFAILED {report.nodeid} ({report.when}): {first[0] if first else '?'}", file=sys.stderr, flush=True)
