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
own, so completion is transitive). `enabled(device)`: only when DDTREE_GPU_EXPERIMENTAL names "pdl"
(kernels/experimental.py: it has not run on a GPU yet), on CUDA with compute capability >= 9 and Triton
not interpreting; elsewhere the kernels compile without the instructions. benchmarks/gpu_gemm.sh with
EXPERIMENTAL=pdl runs its tests and measures it against the default. Knows nothing of what the kernels
compute.
"""

from __future__ import annotations

import os
from functools import lru_cache

import torch

from ddtree_bench.engine.gpu.kernels import experimental
from ddtree_bench.engine.gpu.kernels.common import tl, triton


def _supported() -> bool:
    """This Triton has the launch option and the device functions (3.3+)."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions

        return "launch_pdl" in CUDAOptions.__dataclass_fields__ and hasattr(tl.extra.cuda, "gdc_wait")
    except Exception:  # pragma: no cover - depends on the install
        return False


SUPPORTED = triton is not None and _supported()


def enabled(device) -> bool:
    """Whether kernels on `device` launch with PDL ("pdl" requested, sm_90+, a Triton that has it, not the interpreter)."""
    if not experimental.enabled("pdl") or not SUPPORTED or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return _sm90_or_newer(str(device))


@lru_cache(maxsize=None)
def _sm90_or_newer(device: str) -> bool:
    dev = torch.device(device)
    return dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9


def gdc_options(device) -> dict:
    """The launch keywords of a kernel that calls `enter(USE_GDC)`: USE_GDC and launch_pdl, on where enabled."""
    on = enabled(device)
    return dict(USE_GDC=on, launch_pdl=on)


if triton is not None:

    @triton.jit
    def enter(USE_GDC: tl.constexpr):
        """Wait for the previous kernel (its writes visible), then let the next one launch."""
        if USE_GDC:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()

    @triton.jit
    def prefetch_l2(ptrs):
        """Ask L2 for the 128-byte line of every pointer (evict-last), without waiting for it."""
        tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; // dummy $0", "=r,l", [ptrs],
                                  dtype=tl.int32, is_pure=False, pack=1)
