"""CUDA-graph capture and replay of one engine stage, with an eager twin on other devices.

A `Stage` wraps a zero-argument function that reads persistent input buffers and returns its
outputs. On CUDA the first `run()` warms the function up eagerly (once, and only if the stage is
idempotent: running it twice leaves the same state), captures it into a `torch.cuda.CUDAGraph`,
and replays the graph, so the outputs returned are the graph's static output tensors; later runs
replay. Consumers captured after a producer therefore read the producer's static outputs. On a CPU
(or with graphs off) `run()` just calls the function, so the same code path is testable anywhere.

Stages of one bucket (one budget) share a memory pool and are captured in the order they replay,
so a stage's intermediates can never overwrite an output that a later stage of the round still
reads. Persistent state (caches, the frontier, the context buffer) lives outside every pool.

Python's cyclic garbage collector stays off while a graph is captured (`no_gc`): stages hold
closures over their owners, so dropped stages are freed by that collector, and a CUDAGraph freed
in the middle of another capture destroys its graph inside the capture, which invalidates it (seen
on an H200: "operation not permitted when stream is capturing" from 20 graph resets, then the
capture failed). Owners that drop stages call `release()` first, so their graphs go at once.
`replay_ms` times a function as a captured graph (what the engine pays for it inside a stage); the
engine uses it to pick the fastest of interchangeable exact implementations, bench-engine to report.
Knows nothing of models or trees.
"""

from __future__ import annotations

import gc
import statistics
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch


@contextmanager
def no_gc() -> Iterator[None]:
    """Keep the cyclic garbage collector from running (and freeing CUDA graphs) inside a capture."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Pool:
    """One CUDA-graph memory pool (a handle), shared by the stages of one bucket."""

    def __init__(self, device: torch.device):
        self.handle = torch.cuda.graph_pool_handle() if device.type == "cuda" else None


class Stage:
    def __init__(self, fn: Callable[[], Any], device: torch.device, pool: Pool | None = None, graphs: bool = True,
                 idempotent: bool = True, name: str = ""):
        self.fn, self.name = fn, name
        self.graphs = graphs and device.type == "cuda"
        self.pool = pool
        self.idempotent = idempotent
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: Any = None

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def run(self) -> Any:
        if not self.graphs:
            return self.fn()
        if self.graph is None:
            self._capture()
        self.graph.replay()
        return self.out

    def _capture(self) -> None:
        if self.idempotent:  # warm up (library handles, workspaces, autotuning) outside the graph
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                self.fn()
            torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with no_gc(), torch.cuda.graph(g, pool=self.pool.handle if self.pool is not None else None):
            self.out = self.fn()
        self.graph = g

    def release(self) -> None:
        """Free the graph and its outputs now (outside any capture), not whenever the collector runs."""
        self.graph = None
        self.out = None


def capture(fn: Callable[[], Any]) -> tuple[torch.cuda.CUDAGraph, Any]:
    """fn captured as a graph (two eager warmups on a side stream first): (graph, fn's outputs as the graph's static tensors)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with no_gc(), torch.cuda.graph(g):
        out = fn()
    return g, out


def replay_ms(fn: Callable[[], Any], reps: int = 20, warmup: int = 3) -> float:
    """Median ms of CUDA-graph replays of fn: `capture`, then `warmup` untimed and `reps` timed replays,
    each between two CUDA events."""
    g, _ = capture(fn)
    for _ in range(warmup):
        g.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    del g
    return statistics.median(times)
