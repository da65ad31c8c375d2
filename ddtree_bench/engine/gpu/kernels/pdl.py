"""Programmatic dependent launch (PDL): a kernel of the static forward may start before the one before it ends.

On sm_90+ a kernel launched with `launch_pdl=True` is scheduled as soon as every program of the previous
kernel in the stream has run `griddepcontrol.launch_dependents` (or ended), and its own
`griddepcontrol.wait` blocks until that kernel has finished and its writes are visible. A forward's
layer is ~10 short kernels in a row, each paying launch latency and a ramp-up; with PDL the next one
is already resident when the previous one drains, and a weight GEMM can stream its weights into L2
(`prefetch_l2`; weights never depend on the previous kernel) while the attention or the norm before
it still runs. CUDA graphs keep these programmatic edges.

The rule every kernel here follows (`enter`): nothing touches memory another kernel writes or reads
before `gdc_wait`, so the overlap is only launch, scheduling and weight prefetch, and the order of
every read and write stays the stream's (a kernel waits for its predecessor, which waited for its
own, so completion is transitive). Where a kernel lets its dependent launch is a scheduling choice
only (`griddepcontrol.wait` waits for the whole previous grid and its writes, whenever it was let in):
* "pdl": right after the wait (`enter`), and the weight GEMMs prefetch their weights into L2 first
  (2026-12-02 and -04 on the H200: slower at every n);
* "pdl-bare": right after the wait, no prefetch (the launch overlap alone);
* "pdl-late": after the kernel's main loop, before its stores (`release`), no prefetch: the next kernel's
  programs take SM slots only while this one drains, not for its whole run.
`enabled(device)`: only when DDTREE_GPU_EXPERIMENTAL names one of these (kernels/experimental.py), on CUDA
with compute capability >= 9 and Triton not interpreting; elsewhere the kernels compile without the
instructions. Where none is named, `gdc_options(device, rows)` still turns "pdl-late" on for a launch over at
most LATE_ROWS token rows on an H100 SXM or an H200 (`default_late`, common.is_tuned_hopper; "pdl-off" keeps it
off): the one mode, and the two cards, where it won. benchmarks/gpu_gemm.sh with EXPERIMENTAL=pdl runs its tests and measures it against the
default. Knows nothing of what the kernels compute.
"""

from __future__ import annotations

import os
from functools import lru_cache

import torch

from ddtree_bench.engine.gpu.kernels import experimental
from ddtree_bench.engine.gpu.kernels.common import is_tuned_hopper, tl, triton


def _supported() -> bool:
    """This Triton has the launch option and the device functions (3.3+)."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions

        return "launch_pdl" in CUDAOptions.__dataclass_fields__ and hasattr(tl.extra.cuda, "gdc_wait")
    except Exception:  # pragma: no cover - depends on the install
        return False


SUPPORTED = triton is not None and _supported()


MODES = ("pdl", "pdl-bare", "pdl-late")   # the experimental features that turn PDL on (module docstring)
# Where no mode is named, "pdl-late" on an H100 SXM or an H200 for launches over at most this many token rows
# (DDTREE_PDL_LATE_ROWS moves the edge; "pdl-off" turns PDL off, whatever else is named): it won on the H100 below 33
# rows and tied at 64 in three leases, so the edge sits between (docs/gpu-performance.md, "Late morning (H100,
# 2026-12-06)"); the H200's one A/B put its edge in the same place ("2026-12-06 23:09-23:42 UTC").
LATE_ROWS = 48


def requested() -> bool:
    """Whether DDTREE_GPU_EXPERIMENTAL names a PDL mode (wherever it would run)."""
    return any(experimental.enabled(m) for m in MODES)


def enabled(device) -> bool:
    """Whether kernels on `device` launch with PDL (a mode requested, sm_90+, a Triton that has it, not the interpreter)."""
    return requested() and _may_run() and _sm90_or_newer(str(device))


def _may_run() -> bool:
    """PDL is not switched off ("pdl-off"), this Triton has it, and Triton is not interpreting."""
    return not experimental.enabled("pdl-off") and SUPPORTED and os.environ.get("TRITON_INTERPRET") != "1"


def late() -> bool:
    """The dependent is let in after the main loop ("pdl-late"), not right after the wait."""
    return experimental.enabled("pdl-late")


def prefetch(device) -> bool:
    """The weight GEMMs prefetch their slice into L2 before the wait ("pdl" itself, where PDL runs)."""
    return experimental.enabled("pdl") and enabled(device)


@lru_cache(maxsize=None)
def _sm90_or_newer(device: str) -> bool:
    dev = torch.device(device)
    return dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9


def default_late(device, rows: int) -> bool:
    """Whether a launch over `rows` token rows takes "pdl-late" with no mode named: on an H100 SXM or an H200, rows <=
    LATE_ROWS, unless "pdl-off" (where PDL can run at all: sm_90+, a Triton that has it, not the interpreter)."""
    return _may_run() and rows <= experimental.knob("PDL_LATE_ROWS", LATE_ROWS) and is_tuned_hopper(device)


def describe(device) -> str:
    """Which PDL the forwards on `device` launch with, as results record it: the named mode ("pdl", "pdl-bare",
    "pdl-late") where one runs, "pdl-late up to N rows" where the few-row default does, else "off"."""
    if requested():
        return next(m for m in MODES if experimental.enabled(m)) if enabled(device) else "off"
    return f"pdl-late up to {experimental.knob('PDL_LATE_ROWS', LATE_ROWS)} rows" if default_late(device, 1) else "off"


def gdc_options(device, rows: int | None = None) -> dict:
    """The launch keywords of a kernel that calls `enter(USE_GDC, GDC_LATE)` and `release`: USE_GDC and launch_pdl,
    on where enabled (a named mode) or, with no mode named, where `default_late` holds for the launch's token rows;
    GDC_LATE where the mode is "pdl-late" (or the default's)."""
    if requested():
        on = enabled(device)
        return dict(USE_GDC=on, GDC_LATE=on and late(), launch_pdl=on)
    on = rows is not None and default_late(device, rows)
    return dict(USE_GDC=on, GDC_LATE=on, launch_pdl=on)


if triton is not None:

    @triton.jit
    def enter(USE_GDC: tl.constexpr, GDC_LATE: tl.constexpr):
        """Wait for the previous kernel (its writes visible), then let the next one launch (unless GDC_LATE: `release`)."""
        if USE_GDC:
            tl.extra.cuda.gdc_wait()
            if not GDC_LATE:
                tl.extra.cuda.gdc_launch_dependents()

    @triton.jit
    def release(USE_GDC: tl.constexpr, GDC_LATE: tl.constexpr):
        """GDC_LATE's point to let the next kernel launch: after the main loop, before the stores."""
        if USE_GDC and GDC_LATE:
            tl.extra.cuda.gdc_launch_dependents()

    @triton.jit
    def prefetch_l2(ptrs):
        """Ask L2 for the 128-byte line of every pointer (evict-last), without waiting for it."""
        tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; // dummy $0", "=r,l", [ptrs],
                                  dtype=tl.int32, is_pure=False, pack=1)
