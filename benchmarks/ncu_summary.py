#!/usr/bin/env python3
"""Nsight Compute's text report (what benchmarks/gpu_ncu.sh keeps per n) as one line per kernel launch: duration, DRAM
and compute throughput (% of the card's peak), issue-slot use, grid, registers a thread, dynamic shared memory a
block, theoretical / achieved occupancy, and the stall ncu names first with its cycles a warp between two issues.

    python3 benchmarks/ncu_summary.py ncu_128.txt [ncu_256.txt ...]

Reads the default `ncu` page (sections SpeedOfLight, ComputeWorkloadAnalysis, WarpStateStats, LaunchStats,
Occupancy); a metric ncu did not print reads "-". Knows nothing of which kernel is which layer op: the kernel's name
and grid say that (the launch order of one layer is in gpu_ncu_verify.py's docstring).
"""

from __future__ import annotations

import re
import sys

HEADER = re.compile(r"^  (\S[^(]*?) \(([\d, ]+)\)x\(([\d, ]+)\), Context")
METRICS = {"Duration": "us", "DRAM Throughput": "dram%", "Compute (SM) Throughput": "sm%", "Issue Slots Busy": "issue%",
           "Registers Per Thread": "regs", "Dynamic Shared Memory Per Block": "smem",
           "Theoretical Occupancy": "occ%", "Achieved Occupancy": "ach%", "Warp Cycles Per Issued Instruction": "cpi"}
STALL = re.compile(r"spends ([\d.]+) cycles being stalled (.+?)\. ")
STALL_NAMES = (("L1TEX", "long scoreboard (L1TEX)"), ("MIO", "short scoreboard (MIO)"),
               ("fixed latency", "fixed-latency dependency"), ("barrier", "barrier"), ("math pipe", "math pipe"))


def _stall(section: str) -> str:
    """'NAME CYCLES' for the first stall ncu's warp-state advice names in one kernel's section ('-' if none)."""
    m = STALL.search(" ".join(section.split()))
    if not m:
        return "-"
    name = next((short for key, short in STALL_NAMES if key in m.group(2)), m.group(2)[:30])
    return f"{name} {m.group(1)}"


def parse(text: str) -> list[dict[str, str]]:
    """One dict per kernel section of an ncu text report (METRICS' short names, 'kernel', 'grid', 'stall')."""
    rows: list[dict[str, str]] = []
    body: list[list[str]] = []
    for line in text.splitlines():
        m = HEADER.match(line)
        if m:
            grid = "x".join(x.strip() for x in m.group(2).split(","))
            rows.append({"kernel": m.group(1).strip()[:40], "grid": grid})
            body.append([])
            continue
        if not rows:
            continue
        body[-1].append(line)
        row = rows[-1]
        for name, key in METRICS.items():
            if line.strip().startswith(name + " ") and key not in row:
                parts = line.split()
                unit, value = parts[-2], parts[-1].replace(",", "")
                if key == "us" and unit == "ms":
                    value = f"{float(value) * 1e3:.2f}"
                if key == "smem" and unit.startswith("byte"):
                    value = f"{float(value) / 1e3:.2f}"
                row[key] = value
    for row, lines in zip(rows, body):
        row["stall"] = _stall("\n".join(lines))
    return rows


def table(rows: list[dict[str, str]]) -> str:
    cols = ["kernel", "grid", "us", "dram%", "sm%", "issue%", "cpi", "regs", "smem", "occ%", "ach%", "stall"]
    head = {"smem": "smem KB", "stall": "first stall named (cycles a warp between issues)"}
    cells = [[head.get(c, c) for c in cols]] + [[r.get(c, "-") for c in cols] for r in rows]
    width = [max(len(x[j]) for x in cells) for j in range(len(cols))]
    return "\n".join("  ".join(x[j].ljust(width[j]) for j in range(len(cols))).rstrip() for x in cells)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[3].strip(), file=sys.stderr)
        return 2
    for path in argv:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                rows = parse(f.read())
        except OSError as e:
            print(f"ncu_summary: {path}: {e.strerror}", file=sys.stderr)
            return 2
        if not rows:
            print(f"ncu_summary: {path}: no Nsight Compute kernel section in it (not an ncu text report)", file=sys.stderr)
            return 2
        print(f"# {path}: {len(rows)} kernel launches")
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
