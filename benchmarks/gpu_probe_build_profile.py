"""Where a large-budget tree build spends its time: the auto builder's kernels at B = 256, 512, 1024 on the
Qwen3-8B drafter's shape (L = 15, V = 151,936, bf16 draft logits x3), as CUDA-graph replays under
torch.profiler (perf/profile.py). Prints ms per build, then the top kernels with ms and launches. Needs CUDA:
    python benchmarks/gpu_probe_build_profile.py [--budgets 256,512,1024]
"""

from __future__ import annotations

import argparse

import torch

from ddtree_bench.engine.gpu import builders
from ddtree_bench.engine.gpu.graphs import replay_ms
from ddtree_bench.perf.profile import profile_kernels

L, V = 15, 151936


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budgets", default="256,512,1024")
    ap.add_argument("--kernels", default="grid-keys,grid")
    a = ap.parse_args()
    dev = torch.device("cuda")
    for B in (int(x) for x in a.budgets.split(",")):
        logits = (torch.randn(L, V, generator=torch.Generator().manual_seed(B)) * 3).to(dev, torch.bfloat16)
        for kind in a.kernels.split(","):
            b = builders.checked_builder(L, V, B, dev, kind, dtype=torch.bfloat16)
            if b is None:
                print(f"B={B} {kind}: unusable")
                continue
            ms = replay_ms(lambda: b(logits), reps=20)
            p = profile_kernels(lambda: b(logits), dev, reps=5, graph=True, wall_ms=ms)
            print(f"B={B} {kind}: {ms:.3f} ms per build; kernels {p.kernel_ms:.3f} ms", flush=True)
            for k in p.kernels[:12]:
                print(f"    {k.ms:7.3f} ms  x{k.launches:5.1f}  {k.name[:90]}")


if __name__ == "__main__":
    main()
