"""Which compiled Triton variants a piece of host code launches, found on a machine without a GPU.

`launched_variants(fn)` runs fn with its kernel launches recorded instead of run (kernels/warm.py's
`record`: the tree builders and the top-K launch through `warm.launch`), and binds each launch the way
JITFunction.run does for the CUDA backend at sm_90: the same compile-time constants, integer
specialisations (value 1, divisibility by 16) and launch options, so two launches share a key exactly
when the GPU would reuse one compiled kernel for both. `compile_variant` compiles one to a cubin for
that target (Triton bundles ptxas). The cold-start benchmark (benchmarks/triton_compile_time.py) and
the CPU tests of the builders' choice use this; the engine does not. It leans on Triton 3.x internals
(the binder from `create_function_from_signature`, `JITFunction._pack_args`). Knows nothing of trees,
nor of what a launch computes.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from ddtree_bench.engine.gpu.kernels.common import triton
from ddtree_bench.engine.gpu.kernels.warm import Launch, record

RUN_OPTIONS = dict(debug=False, instrumentation_mode="", fpsan_homomorphic_casts=False)  # what JITFunction.run adds


@dataclass(frozen=True)
class Variant:
    """One compiled kernel a launch needs: what Triton's cache keys it by, and what compiling it takes."""

    kernel: Any          # the JITFunction
    signature: dict
    constexprs: dict
    attrs: dict
    options: Any         # the backend's options object

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__


def _target():
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", 90, 32)


def _backend():
    from triton.compiler import make_backend

    return make_backend(_target())


def launched_variants(fn: Callable[[], Any]) -> dict[tuple, Variant]:
    """key -> Variant of every distinct kernel fn() launches through warm.launch (none is run; the top-K's
    host code returns zeros meanwhile), in first-launch order."""
    return variants_of(record(fn))


def variants_of(launches: list[Launch]) -> dict[tuple, Variant]:
    """key -> Variant of each distinct launch, bound as JITFunction.run binds it for CUDA at sm_90."""
    from triton.runtime.jit import create_function_from_signature

    backend = _backend()
    known = backend.parse_options({}).__dict__
    run_options = {k: v for k, v in RUN_OPTIONS.items() if k in known}   # the options this Triton has
    out: dict[tuple, Variant] = {}
    for la in launches:
        kernel = la.kernel
        binder = create_function_from_signature(kernel.signature, kernel.params, backend)
        kw = {**run_options, **la.kwargs}
        bound, spec, options = binder(*la.args, **kw)
        options, signature, constexprs, attrs = kernel._pack_args(backend, kw, bound, spec, options)
        key = (kernel.fn.__module__, kernel.fn.__name__, str(spec), str(sorted(options.__dict__.items())))
        out.setdefault(key, Variant(kernel, signature, constexprs, attrs, options))
    return out


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system   # children: ptxas


def compile_variant(v: Variant) -> tuple[float, float]:
    """Compile one variant to a cubin for sm_90 (a miss unless TRITON_CACHE_DIR already holds it): (CPU
    seconds of this process and its ptxas, wall seconds). CPU seconds stay meaningful on a shared machine."""
    from triton.compiler import ASTSource

    c0, t0 = _cpu_s(), time.perf_counter()
    triton.compile(ASTSource(v.kernel, v.signature, v.constexprs, v.attrs), target=_target(),
                   options=v.options.__dict__)
    return _cpu_s() - c0, time.perf_counter() - t0
