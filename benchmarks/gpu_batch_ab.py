"""In-process A/B of kernel knobs on whole batched rounds: one `BatchFastLoop` per arm, steps interleaved.

gpu_verify_ab.py times one slot's verify forward; a knob that acts only over 2+ slots (DDTREE_SLOT_TREE_MIN_ROWS,
DDTREE_SLOT_ROWS, ...) needs the batched loop's rounds. Per (point, batch) each arm (perf/knob_ab.Arm: a name and
environment variables) gets its own loop over the same random-weight pair and prompts, built and stepped under its
variables (the first step captures the bucket's graphs, so the kernels chosen there are the arm's); then `--rounds`
rounds, each stepping every arm `--steps` times in a rotated order, and per arm the median over rounds of each
round's median round time (round = the device stages' sum, as bench-engine's batch table; random weights accept
one token a round). Same-process arms differ by the knob, not by the lease (two leases differ by 1-3%); on CUDA
each arm's median SM clock while it stepped is printed beside it (noise/gpu_clocks.py), since arms of one process
can still run at different clocks on a power-capped card. Knows nothing of what the knobs do. On a CPU (--model toy
--device cpu) the loop runs eagerly: a smoke run.

    python benchmarks/gpu_batch_ab.py --points ddtree:16 --batches 2 \\
        --arm default --arm "slot32 DDTREE_SLOT_TREE_MIN_ROWS=32"
"""

from __future__ import annotations

import argparse
import statistics
import sys
from contextlib import nullcontext

import torch

from ddtree_bench.engine.interface import ROUND_STAGES
from ddtree_bench.errors import UsageError
from ddtree_bench.perf.bench import BenchSpec, load_bench_pair
from ddtree_bench.noise.gpu_clocks import ClockSampler, clock_fields, nvsmi_id, span
from ddtree_bench.perf.knob_ab import Arm, arm_env


def _round_ms(r: dict) -> float:
    return sum(r.get(s, 0.0) for s in ROUND_STAGES)


@torch.inference_mode()
def ab(target, drafter, method: str, budget: int, batch: int, arms: list[Arm], a,
       sampler: ClockSampler | None = None) -> dict[str, float | None]:
    """{arm name: median over rounds of its per-round median round ms, "<arm> spread": their max - min,
    "<arm> MHz": the median SM clock while it stepped (None without a sampler)} (see the module docstring)."""
    from ddtree_bench.engine.batch import BatchRequest
    from ddtree_bench.engine.gpu.batch_loop import BatchFastLoop
    from ddtree_bench.engine.proposer import DFlashProposer
    from ddtree_bench.perf.bench import random_prompt

    names = frozenset(k for arm in arms for k in arm.env)
    loops = {}
    for arm in arms:
        with arm_env(arm, names):
            proposer = DFlashProposer(drafter, target) if method != "ar" else None
            loop = BatchFastLoop(target, proposer, method, budget, batch)
            per_round = proposer.block_size if proposer is not None else 1   # most tokens a round can emit
            n_new = (a.warmup + a.rounds * a.steps) * per_round + 1           # every slot stays live throughout
            for i in range(batch):
                loop.admit(BatchRequest(random_prompt(target.cfg.vocab_size, a.prefix_len, i), max_new_tokens=n_new))
            for _ in range(a.warmup):
                loop.step()
        loops[arm.name] = (arm, loop)
    per_round = {arm.name: [] for arm in arms}
    for r in range(a.rounds):
        order = arms[r % len(arms):] + arms[:r % len(arms)]
        for arm in order:
            _, loop = loops[arm.name]
            with arm_env(arm, names), span(sampler, arm.name):
                start = len(loop.rounds)
                for _ in range(a.steps):
                    loop.step()
                if loop.device.type == "cuda":
                    torch.cuda.synchronize()
            per_round[arm.name].append(statistics.median(_round_ms(x) for x in loop.rounds[start:]))
    for _, loop in loops.values():
        loop.release()
    return {k: statistics.median(v) for k, v in per_round.items()} | {
        f"{k} spread": max(v) - min(v) for k, v in per_round.items()} | {
        f"{arm.name} MHz": clock_fields(sampler, arm.name)["sm_clock_mhz"] for arm in arms}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arm", action="append", required=True, help="'NAME VAR=VALUE ...' (repeat; the first is the reference)")
    ap.add_argument("--points", default="ddtree:16", help="method[:budget] list: ar, dflash, ddtree:16 ...")
    ap.add_argument("--batches", default="2")
    ap.add_argument("--shape", default="qwen3-8b")
    ap.add_argument("--model", default=None, help="a pair (e.g. toy) instead of --shape")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args(argv)
    try:
        arms = [Arm.parse(x) for x in a.arm]
        batches = [int(x) for x in a.batches.split(",")]
        points = []
        for point in a.points.split(","):
            method, _, b = point.partition(":")
            if method not in ("ar", "dflash", "ddtree"):
                raise UsageError(f"--points: {point!r} is not ar, dflash or ddtree:BUDGET")
            points.append((point, method, int(b) if b else 16))
    except (UsageError, ValueError) as e:
        print(f"gpu_batch_ab: {e}", file=sys.stderr)
        return 2
    spec = BenchSpec(shape=None if a.model else a.shape, model=a.model or "toy", device=a.device, dtype=a.dtype)
    target, drafter, _, _ = load_bench_pair(spec)
    print(f"# batched rounds, ms (median over {a.rounds} rounds of {a.steps} steps each; x = against {arms[0].name}); "
          + "; ".join(f"{arm.name} = {' '.join(f'{k}={v}' for k, v in arm.env.items()) or '(defaults)'}" for arm in arms))
    for point, method, budget in points:
        for batch in batches:
            with ClockSampler(nvsmi_id(target.lm_head.weight.device)) if spec.device.startswith("cuda") else \
                    nullcontext() as sampler:
                got = ab(target, drafter, method, budget, batch, arms, a, sampler)
            ref = got[arms[0].name]
            cells = "  ".join(f"{arm.name} {got[arm.name]:.3f} ({got[arm.name] / ref:.3f}x, spread "
                              f"{got[arm.name + ' spread']:.3f}"
                              + (f", {got[arm.name + ' MHz']:.0f} MHz" if got[arm.name + " MHz"] else "") + ")"
                              for arm in arms)
            print(f"{point} batch {batch}: {cells}", flush=True)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    print(f"{gpu}, torch {torch.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
