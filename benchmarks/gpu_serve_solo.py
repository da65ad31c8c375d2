"""One request at a time: the batched engine behind `serve --max-batch N` against the single loop behind
`serve --max-batch 1`, in one process, without HTTP.

For each method point (AR, DFlash, DDTree at --budgets) it runs --requests prompts of --prefix-len random tokens,
one after another, --new tokens each, through (a) the single fast loop (`Engine(cuda_graphs=True).generate`) and
(b) a `BatchScheduler` over `BatchFastLoop(max_batch=--slots)` (submit, wait for the result: the engine thread's
hand-off included), after one warmup request each. Per path: the median decode ms per emitted token
((t_done - t_first) / (tokens - 1): the rounds, not the prefill) and the median wall ms per request
(submit to result), and b / a for both. Random weights accept ~nothing, so every round emits ~1 token: the
figures compare round costs, not speedups.

    python benchmarks/gpu_serve_solo.py --shape qwen3-8b --budgets 16,64 --slots 16
    python benchmarks/gpu_serve_solo.py --shape random --device cpu --requests 2 --new 8   # a CPU smoke run
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-8b", help="a perf/shapes.py shape, or random (the tiny random pair)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--budgets", default="16,64")
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--requests", type=int, default=5)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--prefix-len", type=int, default=1024)
    a = ap.parse_args(argv)

    from ddtree_bench.engine.batch import BatchRequest
    from ddtree_bench.engine.batch_scheduler import BatchScheduler
    from ddtree_bench.engine.generate import Engine
    from ddtree_bench.engine.gpu.batch_loop import BatchFastLoop

    if a.shape == "random":
        from ddtree_bench.engine.loading import random_pair

        target, drafter = random_pair(seed=0, vocab_size=272, dtype=a.dtype, device=a.device)
    else:
        from ddtree_bench.perf.shapes import random_shaped_pair

        target, drafter = random_shaped_pair(a.shape, a.dtype, a.device)
    V = target.cfg.vocab_size
    prompts = [[random.Random(i).randrange(V) for _ in range(a.prefix_len)] for i in range(a.requests + 1)]
    points = [("ar", 0), ("dflash", 0)] + [("ddtree", int(b)) for b in a.budgets.split(",")]
    eng = Engine(target, drafter, cuda_graphs=True)

    def decode_ms(g) -> float:
        return (g.t_done_ns - g.t_first_token_ns) / 1e6 / max(1, len(g.output_ids) - 1)

    rows = []
    for method, budget in points:
        single, single_wall = [], []
        for i, p in enumerate(prompts):
            t0 = time.perf_counter()
            g = eng.generate(p, method, budget, a.new)
            if i:   # prompt 0 warms up (compiles, captures)
                single.append(decode_ms(g))
                single_wall.append((time.perf_counter() - t0) * 1e3)
        sched = BatchScheduler(BatchFastLoop(eng.target, eng.proposer if method != "ar" else None, method, budget, a.slots))
        batched, batched_wall = [], []
        try:
            for i, p in enumerate(prompts):
                t0 = time.perf_counter()
                g = sched.submit(BatchRequest(p, a.new)).result(timeout=600)
                if i:
                    batched.append(decode_ms(g))
                    batched_wall.append((time.perf_counter() - t0) * 1e3)
        finally:
            sched.close()
        m = {k: statistics.median(v) for k, v in (("single", single), ("batched", batched), ("single_wall", single_wall),
                                                  ("batched_wall", batched_wall))}
        name = method + (f" B={budget}" if method == "ddtree" else "")
        rows.append((name, m))
        print(f"{name:12s} decode ms/token: single {m['single']:.3f}, batched ({a.slots} slots, scheduler) "
              f"{m['batched']:.3f} = {m['batched'] / m['single']:.3f}x; wall ms/request {m['single_wall']:.1f} vs "
              f"{m['batched_wall']:.1f} = {m['batched_wall'] / m['single_wall']:.3f}x", flush=True)
    dev = torch.device(a.device)
    print(f"# {a.shape} {a.dtype} on {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}; {a.requests} "
          f"requests of {a.new} new tokens after {a.prefix_len} prompt tokens, one at a time; medians", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
