"""One request at a time: the batched engine behind `serve --max-batch N` against the single loop behind
`serve --max-batch 1`, in one process, without HTTP.

For each method point (AR, DFlash, DDTree at --budgets) it runs --requests prompts of --prefix-len random tokens,
one after another, --new tokens each, through (a) the single fast loop (`Engine(cuda_graphs=True).generate`) and
(b) a `BatchScheduler` over `BatchFastLoop(max_batch=--slots)` (submit, wait for the result: the engine thread's
hand-off included), after one warmup request each. Since the scheduler's lone path, (b) runs a request that is alone
through the single loop (`BatchFastLoop.run_alone`); `--batched` turns that off (`lone=False`: every round a batched
step, the comparison this script made before). Per path: the median decode ms per emitted token
((t_done - t_first) / (tokens - 1): the rounds, not the prefill) and the median wall ms per request
(submit to result), and b / a for both. Random weights accept ~nothing, so every round emits ~1 token: the
figures compare round costs, not speedups.

With --concurrency C > 1 the requests come in groups of C at once, as C clients would send them: (a) is what
`serve --max-batch 1` does with them (the single loop serves them one after another, so request i waits for the
i before it) and (b) the scheduler over C or more slots (all C run together). Per path: the median over groups of
the mean latency per request (the group's send to each request's result), of the group's makespan (send to the
last result) and the output tok/s (C * --new / makespan).

    python benchmarks/gpu_serve_solo.py --shape qwen3-8b --budgets 16,64 --slots 16
    python benchmarks/gpu_serve_solo.py --shape qwen3-8b --budgets 16,64 --slots 16 --concurrency 2
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
    ap.add_argument("--concurrency", type=int, default=1, help="requests sent together (groups of this many)")
    ap.add_argument("--batched", action="store_true",
                    help="the scheduler's lone path off: a request alone runs batched steps too (lone=False)")
    a = ap.parse_args(argv)
    if a.concurrency > 1:
        return concurrent(a)

    from ddtree_bench.engine.batch import BatchRequest
    from ddtree_bench.engine.batch_scheduler import BatchScheduler
    from ddtree_bench.engine.gpu.batch_loop import BatchFastLoop

    eng, prompts = _pair(a)
    points = _points(a)

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
        sched = BatchScheduler(BatchFastLoop(eng.target, eng.proposer if method != "ar" else None, method, budget, a.slots),
                               lone=not a.batched)
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


def _points(a) -> list[tuple[str, int]]:
    """(method, budget) of every point: AR, DFlash, DDTree at each of --budgets."""
    return [("ar", 0), ("dflash", 0)] + [("ddtree", int(b)) for b in a.budgets.split(",")]


def _pair(a):
    """(Engine over the shape's random pair, prompts): a.requests * a.concurrency + a.concurrency prompts (the
    first group warms up)."""
    from ddtree_bench.engine.generate import Engine

    if a.shape == "random":
        from ddtree_bench.engine.loading import random_pair

        target, drafter = random_pair(seed=0, vocab_size=272, dtype=a.dtype, device=a.device)
    else:
        from ddtree_bench.perf.shapes import random_shaped_pair

        target, drafter = random_shaped_pair(a.shape, a.dtype, a.device)
    V = target.cfg.vocab_size
    n = (a.requests + 1) * a.concurrency
    prompts = [[random.Random(i).randrange(V) for _ in range(a.prefix_len)] for i in range(n)]
    return Engine(target, drafter, cuda_graphs=True), prompts


def concurrent(a) -> int:
    """--concurrency C: groups of C requests, the single loop one after another vs the scheduler all at once."""
    from ddtree_bench.engine.batch import BatchRequest
    from ddtree_bench.engine.batch_scheduler import BatchScheduler
    from ddtree_bench.engine.gpu.batch_loop import BatchFastLoop

    eng, prompts = _pair(a)
    C = a.concurrency
    groups = [prompts[i:i + C] for i in range(0, len(prompts), C)]
    points = _points(a)

    def serial(group, method: str, budget: int) -> tuple[list[float], int]:   # serve --max-batch 1 with C requests at once
        t0, done, tokens = time.perf_counter(), [], 0
        for p in group:
            tokens += len(eng.generate(p, method, budget, a.new).output_ids)
            done.append((time.perf_counter() - t0) * 1e3)
        return done, tokens

    def together(sched, group) -> tuple[list[float], int]:
        t0, done = time.perf_counter(), []
        futures = [sched.submit(BatchRequest(p, a.new)) for p in group]
        for f in futures:
            f.add_done_callback(lambda _f: done.append((time.perf_counter() - t0) * 1e3))
        tokens = sum(len(f.result(timeout=600).output_ids) for f in futures)
        return done, tokens

    for method, budget in points:
        stats = {}
        sched = BatchScheduler(BatchFastLoop(eng.target, eng.proposer if method != "ar" else None, method, budget,
                                             max(a.slots, C)), lone=not a.batched)
        try:
            for path, run in (("single", lambda g: serial(g, method, budget)), ("batched", lambda g: together(sched, g))):
                mean_ms, makespan_ms, tok_s = [], [], []
                for i, group in enumerate(groups):
                    done, tokens = run(group)
                    if i:   # group 0 warms up (compiles, captures)
                        mean_ms.append(statistics.mean(done))
                        makespan_ms.append(max(done))
                        tok_s.append(tokens / max(done) * 1e3)
                stats[path] = {k: statistics.median(v) for k, v in (("mean", mean_ms), ("makespan", makespan_ms),
                                                                       ("tok_s", tok_s))}
        finally:
            sched.close()
        s_, b_ = stats["single"], stats["batched"]
        name = method + (f" B={budget}" if method == "ddtree" else "")
        print(f"{name:12s} {C} at once: mean latency ms/request single {s_['mean']:.1f}, batched {b_['mean']:.1f} = "
              f"{b_['mean'] / s_['mean']:.3f}x; makespan {s_['makespan']:.1f} vs {b_['makespan']:.1f} = "
              f"{b_['makespan'] / s_['makespan']:.3f}x; output tok/s {s_['tok_s']:.0f} vs {b_['tok_s']:.0f} = "
              f"{b_['tok_s'] / s_['tok_s']:.2f}x", flush=True)
    dev = torch.device(a.device)
    print(f"# {a.shape} {a.dtype} on {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}; {a.requests} "
          f"groups of {C} requests of {a.new} new tokens after {a.prefix_len} prompt tokens; single = one after "
          f"another (serve --max-batch 1), batched = together ({max(a.slots, C)} slots); medians over groups",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
