"""Compile a set of the fast path's Triton kernels concurrently before their first launch (a tree builder's, a row
count's weight GEMMs, the self-tests'), so a cold start waits for the slowest of them instead of the sum.

`launch(kernel, grid, *args, **kwargs)` is how every kernel of the fast path starts (tree builders, top-K,
weight GEMMs, layer ops, attention, argmax, tree compile / walk / commit): it runs `kernel[grid](...)`, or,
inside `collecting()` (this thread only), records the launch instead (perf/round_variants.py records a
whole round that way).
`warm(fn, device)` calls fn collecting, then compiles every recorded launch (`compile_launches`) with
`JITFunction.warmup` (compile, no launch) on one thread per kernel function, its launches in order (so
a variant several launches share is compiled once and then found in Triton's cache), at most
os.cpu_count() threads; `per="variant"` gives each distinct variant of a function its own thread
(`variant_key`: the weight GEMM's launch shapes are many variants of one function). Triton's passes release the GIL and ptxas is a subprocess, so the threads
compile in parallel (docs/gpu-performance.md, "Cold start"). The compiled kernels land in Triton's
in-memory and on-disk caches, where fn's real launches then find them. Host code in fn that reads a
kernel's output must not do so while collecting (`collecting()` is true; the top-K returns zeros).
Each thread then also does what the first real launch would do before running the kernel (`_prepare`): load its
module and build its launcher, which Triton 3.6 compiles as a C extension with the system compiler (~0.3 s each on
the H200's host, one after another at first launch otherwise; docs/gpu-performance.md, "Cold start"). Nothing is
launched; `ready_driver` sets Triton's driver up on the calling thread first.
Knows nothing of trees.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable

import torch

PREPARE_LAUNCHERS = True   # also load each compiled module and build its launcher on the compiling thread (_prepare)
_SINK: ContextVar[list | None] = ContextVar("ddtree_bench_kernel_launches", default=None)


@dataclass
class Launch:
    """One recorded kernel launch."""

    kernel: Any      # a triton JITFunction
    grid: tuple
    args: tuple
    kwargs: dict


def collecting() -> bool:
    """Whether launches on this thread are being recorded instead of run."""
    return _SINK.get() is not None


def launch(kernel, grid: tuple, *args, **kwargs) -> None:
    """kernel[grid](*args, **kwargs), or record it while collecting."""
    sink = _SINK.get()
    if sink is None:
        kernel[grid](*args, **kwargs)
    else:
        sink.append(Launch(kernel, grid, args, kwargs))


def record(fn: Callable[[], Any]) -> list[Launch]:
    """Every launch fn() makes through `launch`, none run."""
    sink: list[Launch] = []
    token = _SINK.set(sink)
    try:
        fn()
    finally:
        _SINK.reset(token)
    return sink


def variant_key(la: Launch) -> tuple:
    """What Triton compiles a launch for, as far as it shows from the call: the kernel, its compile-time
    keyword arguments, and per positional argument its dtype (tensors) or whether it is 1 or a multiple
    of 16 (ints: Triton's integer specialisations). Launches with one key share one compiled variant."""
    def spec(a):
        if torch.is_tensor(a):
            return str(a.dtype), a.data_ptr() % 16 == 0
        if isinstance(a, bool) or not isinstance(a, int):
            return type(a).__name__
        return a == 1, a % 16 == 0

    return id(la.kernel), tuple(sorted((k, repr(v)) for k, v in la.kwargs.items())), tuple(spec(a) for a in la.args)


def _prepare(compiled) -> None:
    """What Triton's first launch of a compiled kernel does before it runs: load its module and build its launcher
    (a C extension compiled by the system compiler in some Triton versions, then found in Triton's cache)."""
    init = getattr(compiled, "_init_handles", None)
    if init is not None:
        init()


def ready_driver(device) -> None:
    """Triton's driver set up on this thread (CUDA only), before threads compile, so they do not race to set it up."""
    if torch.device(device).type == "cuda":
        from triton.runtime import driver

        driver.active.get_current_target()


def compile_launches(launches: list[Launch], device, per: str = "kernel") -> None:
    """Compile (JITFunction.warmup: no launch) recorded launches and _prepare each, one thread per kernel function
    (per="variant": per variant_key), each one's launches in order, at most os.cpu_count() threads; one chain
    compiles on the calling thread. Only Triton runs here (and, on CUDA, the thread's current device is set, which
    Triton compiles and loads for): no launch, no torch CUDA op. A compile error is raised here. Call
    ready_driver(device) on the first thread first."""
    by_kernel: dict[Any, list[Launch]] = {}
    for la in launches:
        by_kernel.setdefault(id(la.kernel) if per == "kernel" else variant_key(la), []).append(la)
    dev = torch.device(device)

    def compile_chain(chain: list[Launch]) -> None:
        ctx = torch.cuda.device(dev) if dev.type == "cuda" else nullcontext()
        with ctx:   # Triton compiles for the thread's current device
            for la in chain:
                compiled = la.kernel.warmup(*la.args, grid=la.grid, **la.kwargs)
                if PREPARE_LAUNCHERS and compiled is not None:
                    _prepare(compiled)

    chains = list(by_kernel.values())
    if len(chains) <= 1:
        for chain in chains:
            compile_chain(chain)
    else:
        with ThreadPoolExecutor(min(len(chains), os.cpu_count() or 1)) as pool:
            for f in [pool.submit(compile_chain, c) for c in chains]:
                f.result()


def warm(fn: Callable[[], Any], device, per: str = "kernel") -> int:
    """Compile (not run) every kernel fn() launches, one thread per kernel function (per="variant": per
    variant_key); returns how many launches were warmed. A compile error is raised here, as the real
    launch would raise it."""
    launches = record(fn)
    if launches:   # Triton's driver set up here, not raced for by the threads
        ready_driver(device)
    compile_launches(launches, device, per)
    return len(launches)
