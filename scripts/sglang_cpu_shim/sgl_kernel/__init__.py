"""A stand-in for the compiled CPU build of `sgl_kernel`, which PyPI does not have (the `sglang-kernel` wheel
holds only sm90/sm100 CUDA libraries).

SGLang 0.5.23 imports names from `sgl_kernel` at module level, unconditionally on CPU, in modules every
server loads (e.g. `mem_cache/allocation.py`, `kernels/ops/kvcache/cache_move.py`,
`kernels/ops/speculative/{cache_locs,eagle,spec_tree}.py`, `sampling/murmur_hash.py`); on a CPU without AMX
its layer ops fall back to its own torch code and call none of them for a dense AR model. So: the ops that
DFlash reaches are plain-torch versions (`torch_ops.py`, the shim's patch P4); every other imported name
exists and raises a clear error if anything ever calls it. Part of ddtree-bench's SGLang CPU shim
(installed into the SGLang venv only); knows nothing of SGLang's internals beyond those names.
"""

from __future__ import annotations

from sgl_kernel.torch_ops import IMPLEMENTED

DDTREE_BENCH_STAND_IN = True

# Imported by SGLang 0.5.23 on CPU (seen at import of a DFlash server), never called by AR or DFlash there.
ABSENT = ()


def _absent(name: str):
    def op(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name}: the compiled CPU sgl-kernel is not installed; ddtree-bench's "
                                  "CPU shim provides only the ops SGLang's AR and DFlash paths call on a CPU")
    op.__name__ = name
    return op


globals().update(IMPLEMENTED)
globals().update({name: _absent(name) for name in ABSENT})


def __getattr__(name: str):   # discovery aid while ABSENT is being filled in
    import sys
    if name.startswith("__"):
        raise AttributeError(name)
    print(f"ddtree-bench-shim: sgl_kernel.{name} requested", file=sys.stderr, flush=True)
    return _absent(name)
