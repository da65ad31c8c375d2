"""GPU probe: per-kernel time of one graph-replayed verify forward, to explain odd points of the
verify curve (the toy pair's 16-token forward was slower than its 64-token one on an H200) and to
show what the fused layer ops leave. Prints, per (pair, tokens, layer ops): the forward's replay
time and its ten most expensive kernels from torch.profiler.
Run: python benchmarks/gpu_probe_kernels.py [toy|qwen3-8b] (default: both)
"""

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from ddtree_bench.engine.gpu.fused import TORCH_OPS, merge_projections, ops_for
from ddtree_bench.engine.gpu.forward import StaticKV, group_size, target_forward, visible_bias
from ddtree_bench.engine.gpu.tree_ops import verify_visible
from ddtree_bench.perf.timing import time_fn

dev = torch.device("cuda")


def load(name):
    if name == "toy":
        from pathlib import Path

        from ddtree_bench.engine.loading import load_target

        return load_target(Path("ddtree_bench/models/toy/target"), "float32", "cuda"), 512
    from ddtree_bench.perf.shapes import random_shaped_pair

    return random_shaped_pair(name, "bfloat16", "cuda", with_drafter=False)[0], 1024


@torch.inference_mode()
def probe(name, tokens):
    target, prefix = load(name)
    merge_projections(target)
    dt = target.lm_head.weight.dtype
    cap = -(-(prefix + max(tokens)) // 64) * 64
    cache = target.new_cache(cap)
    target(torch.arange(prefix, device=dev) % target.cfg.vocab_size, torch.arange(prefix, device=dev), cache, 0)
    start = torch.tensor(prefix, device=dev)
    for T in tokens:
        ids = torch.arange(T, device=dev) % target.cfg.vocab_size
        pos = start + torch.arange(T, device=dev)
        anc = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
        bias = visible_bias(verify_visible(anc, start, cap), dt, group_size(target))
        for ops in (ops_for(dev, dt), TORCH_OPS):
            fn = lambda: target_forward(target, ids, pos, StaticKV(cache), start, bias, (), ops)  # noqa: E731
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                fn()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            ms = time_fn(g.replay, dev, reps=20, warmup=3)
            print(f"== {name} T={T} ops={ops.name}: {ms:.3f} ms replay", flush=True)
            try:
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    g.replay()
                    torch.cuda.synchronize()
                evs = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
                print(f"   {sum(e.count for e in evs)} kernels")
                for e in sorted(evs, key=lambda e: -e.device_time_total)[:10]:
                    print(f"   {e.device_time_total / 1e3:8.3f} ms  x{e.count:<5d} {e.key[:110]}")
            except Exception as e:  # the profile is a bonus; the replay time above is the measurement
                print(f"   (profiler failed: {type(e).__name__}: {e})")
            del g
    target = cache = None   # free them before the next pair loads (a del would leave the lambdas above unbound names)
    torch.cuda.empty_cache()


names = sys.argv[1:] or ["toy", "qwen3-8b"]
for name in names:
    probe(name, [15, 16, 17, 64] if name == "toy" else [1, 17, 257])
