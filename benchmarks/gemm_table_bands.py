#!/usr/bin/env python3
"""Write a GEMM table for DDTREE_GEMM_TABLE: a built-in one (kernels/gemm.py) with some projections' bands replaced.

What it knows: the tables' shape (per (N, K, swiglu), bands of (max rows, launch shape or None = cuBLAS)), the
projection names of a model shape (gpu_gemm_tune.projections), and `gemm.table_to_json`'s format. It keeps every
band of a named projection up to --above rows and puts the --set bands above them; other projections keep all
theirs. It times nothing: the A/B of the written table is benchmarks/gpu_verify_ab.py's, the suite under it
gpu_suite.sh's, both with DDTREE_GEMM_TABLE=<file> (docs/gpu-performance.md, "Known gaps").

A shape is BLOCK_MxBLOCK_NxBLOCK_K/split_k/warps/stages, or "cublas":

    python3 benchmarks/gemm_table_bands.py --base h100 --above 64 --out gu97.json \\
        --set "gate_up:96=cublas,128=64x64x128/1/4/4" --set "lm_head:96=cublas,128=128x128x128/1/4/3"
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

from ddtree_bench.engine.gpu.kernels import gemm
from ddtree_bench.engine.gpu.kernels.gemm_parts import GemmConfig
from ddtree_bench.errors import UsageError
from ddtree_bench.perf.shapes import SHAPES
from gpu_gemm_tune import projections

SHAPE_RE = re.compile(r"(\d+)x(\d+)x(\d+)/(\d+)/(\d+)/(\d+)")


def parse_set(spec: str, names: dict) -> tuple[tuple[int, int, bool], tuple]:
    """'PROJ:ROWS=SHAPE,...' -> (the projection's table key, its new bands sorted by rows); ValueError if malformed."""
    proj, _, rest = spec.partition(":")
    if proj not in names or not rest:
        raise ValueError(f"--set {spec!r}: want PROJ:ROWS=SHAPE,... with PROJ one of {', '.join(names)}")
    bands = []
    for item in rest.split(","):
        rows, _, shape = item.partition("=")
        m = SHAPE_RE.fullmatch(shape)
        if not rows.isdigit() or not (shape == "cublas" or m):
            raise ValueError(f"--set {spec!r}: {item!r} is not ROWS=BMxBNxBK/split/warps/stages or ROWS=cublas")
        bands.append((int(rows), None if shape == "cublas" else GemmConfig(*(int(g) for g in m.groups()))))
    return names[proj], tuple(sorted(bands, key=lambda b: b[0]))


def build(base: dict, sets: list[tuple[tuple[int, int, bool], tuple]], above: int) -> dict:
    """`base` with each set's projection keeping its bands of <= `above` rows and taking the set's bands above
    (gemm.merged, one projection at a time so each keeps its own band edges)."""
    table = base
    for key, bands in sets:
        if any(rows <= above for rows, _ in bands):
            raise ValueError(f"every --set band must lie above --above {above} rows")
        table = gemm.merged(table, {key: bands}, bands=(above,) + tuple(rows for rows, _ in bands))
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", choices=("h100", "h200"), required=True, help="the built-in table to start from")
    ap.add_argument("--set", action="append", required=True, help="PROJ:ROWS=SHAPE,... (repeat per projection)")
    ap.add_argument("--above", type=int, required=True, help="a set projection keeps its bands up to this many rows")
    ap.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES))
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    try:
        names = projections(a.shape)
        sets = [parse_set(s, names) for s in a.set]
        table = build(gemm.H100_TABLE if a.base == "h100" else gemm.H200_TABLE, sets, a.above)
        doc = gemm.table_to_json(table)
        gemm.table_from_json(doc)   # the launch shapes' own checks (powers of two, >= 16, ...)
    except (KeyError, ValueError, UsageError) as e:
        print(f"gemm_table_bands: {e}", file=sys.stderr)
        return 2
    tmp = f"{a.out}.tmp-{os.getpid()}"   # written whole, then renamed: no half-written table
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    os.replace(tmp, a.out)
    for key, _ in sets:
        print(f"{key}: " + ", ".join(f"<= {r}: {'cublas' if c is None else c}" for r, c in table[key]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
