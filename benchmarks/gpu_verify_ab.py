#!/usr/bin/env python3
"""Kernel knobs A/B on the verify forward, all arms in one process (ddtree_bench/perf/knob_ab.py).

Each --arm is 'NAME VAR=VALUE ...' (the first is the reference: its logits are the others' twin, and x
columns are against it); each arm's graphs are captured under its variables and timed round-robin with the
others. --scales gives the curve trees' draft-logit scale(s): 3 wide trees, 12 deep ones. --gemm-only times
perf.bench.gemm_only's graph (every weight GEMM once on cuBLAS) in the same round-robin and prints each arm's ratio
to it (issue 35's item 2).

  python3 benchmarks/gpu_verify_ab.py --arm default --arm "tiles DDTREE_ROPE_TILES_FROM=1" \\
      --tokens 1,16,64,128,256,512,1024 --scales 3,12 --out /tmp/ab.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from ddtree_bench.errors import UsageError
from ddtree_bench.perf.bench import BenchSpec, CurveSetup, gemm_only, load_bench_pair
from ddtree_bench.perf.knob_ab import Arm, run_ab, table
from ddtree_bench.perf.roofline import roofline_ms, weight_bytes_and_params


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arm", action="append", required=True, help="'NAME VAR=VALUE ...' (repeat; the first is the reference)")
    ap.add_argument("--shape", default="qwen3-8b")
    ap.add_argument("--model", default=None, help="a pair (e.g. toy) instead of --shape")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--tokens", default="1,16,64,128,256,512,1024")
    ap.add_argument("--scales", default="3", help="curve trees' logit scales, e.g. 3,12")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--gemm-only", action="store_true", help="time the GEMM-only floor beside the arms")
    ap.add_argument("--out", default=None, help="JSON file")
    a = ap.parse_args(argv)
    try:
        arms = [Arm.parse(x) for x in a.arm]
        tokens = [int(x) for x in a.tokens.split(",")]
    except (UsageError, ValueError) as e:
        print(f"gpu_verify_ab: {e}", file=sys.stderr)
        return 2
    spec = BenchSpec(shape=None if a.model else a.shape, model=a.model or "toy", device=a.device, dtype=a.dtype)
    target, drafter, _, info = load_bench_pair(spec)
    device = target.lm_head.weight.device
    w, p = weight_bytes_and_params(target)
    roof = lambda n: roofline_ms(w, p, n)  # noqa: E731
    doc = {"info": info, "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "arms": [{"name": x.name, "env": x.env} for x in arms], "by_scale": {}}
    for scale in [float(s) for s in a.scales.split(",")]:
        t0 = time.time()
        setup = CurveSetup(target, drafter.target_layer_ids, a.prefix_len, tokens, device, logit_scale=scale)
        floors = {"gemm_only": lambda n: gemm_only(target, n, device)} if a.gemm_only else None
        rows = run_ab(setup, arms, tokens, a.rounds, a.reps, progress=lambda m: print(m, file=sys.stderr, flush=True),
                      floors=floors)
        doc["by_scale"][str(scale)] = rows
        print(f"\n## curve trees x{scale:g} ({time.time() - t0:.0f} s); arms: "
              + "; ".join(f"{x.name} = {' '.join(f'{k}={v}' for k, v in x.env.items()) or '(defaults)'}" for x in arms))
        print(table(rows, roof), flush=True)
        del setup
    if a.out:
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
