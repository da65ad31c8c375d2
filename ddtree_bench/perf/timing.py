"""Timing one piece of device work: CUDA events around it after warmup (GPU), perf_counter (CPU).

`time_fn(fn, device)` returns the median milliseconds of `reps` calls after `warmup` calls.
`graph_time_fn` captures `fn` into a CUDA graph first and times its replays: that is the cost the
engine pays inside a captured stage. Knows nothing of models.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

from ddtree_bench.engine.gpu.graphs import replay_ms as graph_time_fn  # noqa: F401 (re-exported)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn: Callable[[], Any], device: torch.device, reps: int = 10, warmup: int = 2) -> float:
    """Median ms of `reps` calls of fn (each call timed on its own, after `warmup` untimed calls)."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    if device.type == "cuda":
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
    else:
        for _ in range(reps):
            t = time.perf_counter_ns()
            fn()
            times.append((time.perf_counter_ns() - t) / 1e6)
    return statistics.median(times)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")
