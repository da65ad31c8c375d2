#!/usr/bin/env python3
"""One verify forward of the 8B shape (random bf16 weights, 1024-token prefix) inside a profiler range, for Nsight
Compute: what each kernel of a layer spends its time on (hardware counters), where the CUDA-event timings of
bench-engine --profile only say how long.

The forward runs eagerly (the same kernels a captured graph replays), twice to compile and warm, then once between
cudaProfilerStart / Stop, so `ncu --profile-from-start off` sees that forward's kernels only; `--launch-skip` /
`--launch-count` pick a layer (about 10-11 launches a layer after a few before layer 0). Needs CUDA and ncu:

    ncu --clock-control none --profile-from-start off --launch-skip 40 --launch-count 12 \\
        --section SpeedOfLight --section WarpStateStats python3 benchmarks/gpu_ncu_verify.py --tokens 128

Without ncu it runs as well (nothing is profiled) and prints the forward's wall time, a smoke check of the script.
Knows nothing of ncu's output; benchmarks/gpu_ncu.sh runs it per n and keeps what ncu prints.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from ddtree_bench.perf.bench import BenchSpec, CurveSetup, load_bench_pair


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=128, help="tree tokens n of the verify (root included)")
    ap.add_argument("--shape", default="qwen3-8b")
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--scale", type=float, default=3.0, help="draft-logit scale of the tree: 3 wide, 12 deep")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_ncu_verify: needs CUDA", file=sys.stderr)
        return 2
    target, drafter, _, _ = load_bench_pair(BenchSpec(shape=a.shape, device="cuda", dtype="bfloat16"))
    setup = CurveSetup(target, drafter.target_layer_ids, a.prefix_len, [a.tokens], torch.device("cuda"),
                       logit_scale=a.scale)
    point = setup.point(a.tokens, with_path=True)
    fwd = point.forward()
    with torch.inference_mode():
        for _ in range(2):
            fwd()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        t0 = time.perf_counter()
        fwd()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3
        torch.cuda.cudart().cudaProfilerStop()
    print(f"gpu_ncu_verify: n={a.tokens} depth={point.depth} eager forward {wall_ms:.2f} ms "
          f"({torch.cuda.get_device_name()})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
