"""Prints where a batched fast-loop round spends its GPU time: the per-kernel profile of whole rounds of
`gpu.batch_loop.BatchFastLoop` (CUDA graphs, Qwen3-8B shape, random bf16 weights, 1024-token prefix) per
(method, budget, batch), and of the slotted tree build alone at each batch.

Per point: `--warmup` rounds (the first captures the bucket's graphs), then `--rounds` rounds under
torch.profiler; kernels are folded by name (ms and launches per round, largest first) and by family
(perf/profile.family), with the rounds' median stage times beside them. It answers "which kernels does a
batch-2 round run that a batch-1 round does not", the question the stage table alone leaves open.
Run (needs CUDA): python benchmarks/gpu_batch_profile.py --points ddtree:16,dflash --batches 1,2,16 [--top 25]
"""

from __future__ import annotations

import argparse
import gc
import json

import torch

from ddtree_bench.perf.profile import _cuda_spans, _profiled, kernel_profile


def _fold(spans, rounds: int):
    return kernel_profile([(n, e - s, 1) for n, s, e in spans], rounds, "graph")


def _print(title: str, prof, top: int) -> None:
    fams = " ".join(f"{k} {v:.3f}" for k, v in prof.families_ms.items() if v > 0.0005)
    print(f"\n== {title}: kernels {prof.kernel_ms:.3f} ms per round ({fams})")
    print(f"{'ms':>7} {'launches':>8}  kernel")
    for k in prof.kernels[:top]:
        print(f"{k.ms:7.3f} {k.launches:8.1f}  {k.name[:110]}")
    if len(prof.kernels) > top:
        rest = prof.kernels[top:]
        print(f"{sum(k.ms for k in rest):7.3f} {sum(k.launches for k in rest):8.1f}  ({len(rest)} more kernels)")


@torch.inference_mode()
def round_profile(target, drafter, method: str, budget: int, batch: int, a) -> None:
    from ddtree_bench.engine.batch import BatchRequest
    from ddtree_bench.engine.gpu.batch_loop import BatchFastLoop
    from ddtree_bench.engine.proposer import DFlashProposer
    from ddtree_bench.perf.bench import random_prompt
    from ddtree_bench.perf.timing import median

    proposer = DFlashProposer(drafter, target) if method != "ar" else None
    loop = BatchFastLoop(target, proposer, method, budget, batch)
    n_new = (a.warmup + a.rounds + 2) * 16 + 1
    for i in range(batch):
        loop.admit(BatchRequest(random_prompt(target.cfg.vocab_size, a.prefix_len, i), max_new_tokens=n_new))
    for _ in range(a.warmup):
        loop.step()
    if loop.device.type == "cuda":
        torch.cuda.synchronize()
    start = len(loop.rounds)
    prof = _profiled(loop.step, a.rounds, [torch.profiler.ProfilerActivity.CPU,
                                           torch.profiler.ProfilerActivity.CUDA])
    stages = {k: median([r[k] for r in loop.rounds[start:] if k in r])
              for k in ("draft", "tree_build", "tree_compile", "verify", "walk", "commit") if k in loop.rounds[-1]}
    what = method + (f" B={budget}" if method == "ddtree" else "")
    print(f"\n#### {what}, batch {batch}: stage medians (ms) "
          + " ".join(f"{k} {v:.3f}" for k, v in stages.items()) + f"; builder {loop.tree_builder}")
    _print(f"{what}, batch {batch}, whole rounds", _fold(_cuda_spans(prof), a.rounds), a.top)
    loop.release()
    del loop
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@torch.inference_mode()
def build_profile(budget: int, batch: int, V: int, a) -> None:
    from ddtree_bench.engine.gpu import builders
    from ddtree_bench.perf.profile import profile_kernels

    L = 15
    from ddtree_bench.engine.gpu.batch_tree import BatchTreeBuilder

    exact = BatchTreeBuilder(L, V, budget, "cuda", logits_dtype=torch.bfloat16)   # the batched loop's (its log-probs)
    tb = builders.checked_slotted(L, V, budget, batch, "cuda", torch.bfloat16, exact=exact,
                                  kernel=builders.batched_kernel(budget))
    if tb is None:
        print(f"\n== slotted build B={budget}, batch {batch}: unavailable")
        return
    g = torch.Generator(device="cuda").manual_seed(batch)
    x = (torch.randn(batch, L, V, device="cuda", generator=g) * 3).to(torch.bfloat16)
    _print(f"slotted build B={budget}, batch {batch}, one build (graph replays)",
           profile_kernels(lambda: tb(x), torch.device("cuda"), reps=a.rounds), a.top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", default="ddtree:16,dflash", help="method[:budget] list: ar, dflash, ddtree:16 ...")
    ap.add_argument("--batches", default="1,2,16")
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--no-build", action="store_true", help="skip the slotted build alone")
    ap.add_argument("--shape", default="qwen3-8b", help="a perf/shapes.py name, or a JSON target config (smoke runs)")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    from ddtree_bench.perf.shapes import random_shaped_pair

    shape = json.loads(a.shape) if a.shape.startswith("{") else a.shape
    target, drafter = random_shaped_pair(shape, "bfloat16", a.device)
    batches = [int(x) for x in a.batches.split(",")]
    for point in a.points.split(","):
        method, _, b = point.partition(":")
        budget = int(b) if b else 16
        for batch in batches:
            round_profile(target, drafter, method, budget, batch, a)
        if method == "ddtree" and not a.no_build:
            for batch in batches:
                if batch > 1:
                    build_profile(budget, batch, target.cfg.vocab_size, a)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    print(f"\n{gpu}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
