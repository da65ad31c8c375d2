"""AR with two rounds in flight against one, in one process: what the batched loop's AR pipelining
(`BatchFastLoop.pipeline_ar`, `_ar_step`) buys in wall time.

An AR round's input, the pick, is already on the device, so from two requests up the batched loop queues round
k + 1 before the host reads round k; with `pipeline_ar = False` it queues one round at a time and the device idles
while the host reads, emits and queues. For each of --batches (>= 2; one request alone is never pipelined, as the
single loop is not): BatchFastLoop with N requests admitted, then per arm (alternating on / off, --reps times each,
so drift in the lease hits both) --steps timed `step()` calls: wall ms per step (median) and the device round (the
stage times' sum, median), so the gap is step - round.

    python benchmarks/gpu_ar_pipeline.py --shape qwen3-8b --batches 2,4,16
    python benchmarks/gpu_ar_pipeline.py --shape random --device cpu --dtype float32 --batches 2 --steps 4 --reps 1   # CPU smoke
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
    ap.add_argument("--batches", default="2,4,16")
    ap.add_argument("--steps", type=int, default=40, help="timed steps per rep of a batch")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prefix-len", type=int, default=1024)
    a = ap.parse_args(argv)

    from ddtree_bench.engine.batch import BatchRequest
    from ddtree_bench.engine.gpu.batch_loop import BatchFastLoop
    from ddtree_bench.engine.interface import ROUND_STAGES

    if a.shape == "random":
        from ddtree_bench.engine.loading import random_pair

        target, _ = random_pair(seed=0, vocab_size=272, dtype=a.dtype, device=a.device)
    else:
        from ddtree_bench.perf.shapes import random_shaped_pair

        target, _ = random_shaped_pair(a.shape, a.dtype, a.device)
    V = target.cfg.vocab_size
    prompt = [[random.Random(i).randrange(V) for _ in range(a.prefix_len)] for i in range(32)]
    cuda = torch.device(a.device).type == "cuda"
    arms = [True, False] * a.reps

    for n in (int(x) for x in a.batches.split(",")):
        if n < 2:
            raise SystemExit("--batches: sizes of 2 or more (one request alone is never pipelined)")
        loop = BatchFastLoop(target, None, "ar", 0, n)
        need = (2 + a.reps * 2) * a.steps + 16
        for i in range(n):
            loop.admit(BatchRequest(prompt[i % len(prompt)], max_new_tokens=need))
        for _ in range(8):   # warm: compile, capture
            loop.step()
        wall: dict[bool, list[float]] = {True: [], False: []}
        dev: dict[bool, list[float]] = {True: [], False: []}
        for on in arms:
            loop.pipeline_ar = on
            loop.step()   # the switch settles (one round still in flight when turned off)
            k = len(loop.rounds)
            if cuda:
                torch.cuda.synchronize()
            for _ in range(a.steps):
                t = time.perf_counter_ns()
                loop.step()
                wall[on].append((time.perf_counter_ns() - t) / 1e6)
            dev[on].extend(sum(r.get(s, 0.0) for s in ROUND_STAGES) for r in loop.rounds[k:])
        m = {k: statistics.median(v) for k, v in (("on", wall[True]), ("off", wall[False]), ("don", dev[True]),
                                                  ("doff", dev[False]))}
        name = f"batch {n}"
        print(f"{name:12s} ms/step: one in flight {m['off']:.3f} (round {m['doff']:.3f}, gap {m['off'] - m['doff']:.3f}), "
              f"two {m['on']:.3f} (round {m['don']:.3f}, gap {m['on'] - m['don']:.3f}) = {m['on'] / m['off']:.3f}x",
              flush=True)
        loop.release()
        del loop
    where = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"# {a.shape} {a.dtype} on {where}; AR after {a.prefix_len} prompt tokens; arms alternate, {a.reps} reps each; "
          "medians", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
