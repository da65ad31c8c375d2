"""Cold start per point with the round's kernels warmed at once (`FastLoop._warm_round`) against without, each arm in
its own process on its own fresh Triton cache.

Per arm, a child process builds the shape's random pair and a CUDA-graph Engine, then times: the fused layer ops'
self-test (`ops_for`, the first use of the ops), and the first round of each point in order (AR first, as a sweep
runs it): `FastLoop.cold_s`, from making the point's bucket (its builder checked, its GEMMs and - arm on - its round
warmed) to the first walk result. Arm off replaces `_warm_round` with a no-op, so its first rounds compile the
forward's layer ops, attention, argmax and the tree compile / walk / commit one after another.

    python benchmarks/gpu_cold_start.py --shape qwen3-8b --points ar,dflash,ddtree:16,ddtree:64
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def child(a) -> None:
    import random

    import torch

    from ddtree_bench.engine.generate import Engine
    from ddtree_bench.engine.gpu.loop import FastLoop
    from ddtree_bench.perf.shapes import random_shaped_pair

    if a.child == "off":
        FastLoop._warm_round = lambda self, b: None
    target, drafter = random_shaped_pair(a.shape, a.dtype, "cuda")
    eng = Engine(target, drafter, cuda_graphs=True)
    loop = eng.fast_loop()
    torch.cuda.synchronize()
    t = time.perf_counter()
    loop.ops   # the self-test, on first use
    out = {"self_test_s": time.perf_counter() - t}
    prompt = [random.Random(0).randrange(target.cfg.vocab_size) for _ in range(a.prefix_len)]
    for point in a.points.split(","):
        method, _, budget = point.partition(":")
        budget = int(budget or 0)
        eng.generate(prompt, method, budget, 8)
        out[point] = loop.cold_s[(method, budget)]
    print(json.dumps(out), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-8b")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--points", default="ar,dflash,ddtree:16,ddtree:64")
    ap.add_argument("--arms", default="on,off")
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(a)
        return 0
    rows = {}
    for arm in a.arms.split(","):
        with tempfile.TemporaryDirectory(prefix="triton-cold-") as cache:
            env = dict(os.environ, TRITON_CACHE_DIR=cache)
            cmd = [sys.executable, __file__, "--child", arm, "--shape", a.shape, "--dtype", a.dtype, "--points", a.points,
                   "--prefix-len", str(a.prefix_len)]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if p.returncode:
                print(p.stderr[-4000:], file=sys.stderr)
                return p.returncode
            rows[arm] = json.loads(p.stdout.strip().splitlines()[-1])
            print(f"arm {arm}: " + ", ".join(f"{k} {v:.1f} s" for k, v in rows[arm].items()), flush=True)
    print(f"# {a.shape} {a.dtype}; each arm a fresh process on a fresh Triton cache; first round per point "
          f"(FastLoop.cold_s) after {a.prefix_len} prompt tokens; arm on: the round's kernels warmed at once",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
