"""A stand-in for the compiled CPU build of `sgl_kernel`, which PyPI does not have (the `sglang-kernel` wheel
holds only sm90/sm100 CUDA libraries).

SGLang 0.5.23 imports names from `sgl_kernel` at module level, unconditionally on CPU, in modules every
server loads (e.g. `mem_cache/allocation.py`, `kernels/ops/kvcache/cache_move.py`,
`kernels/ops/speculative/{cache_locs,eagle,spec_tree}.py`, `sampling/murmur_hash.py`); on a CPU without AMX
its layer ops fall back to its own torch code and call none of them for a dense AR model. So: the three ops
DFlash reaches are plain-torch versions (`torch_ops.py`, the shim's patch P4); the other names SGLang imports
exist and raise a clear error if anything ever calls them. Names SGLang does not import at module level are
absent, as in a build without them (e.g. `sgl_kernel.mamba`, `torch.ops.sgl_kernel.*`: hybrid models). Part of ddtree-bench's SGLang CPU shim
(installed into the SGLang venv only); knows nothing of SGLang's internals beyond those names.
"""

from __future__ import annotations

from sgl_kernel.torch_ops import IMPLEMENTED

DDTREE_BENCH_STAND_IN = True

# Imported by SGLang 0.5.23 on CPU at module level (seen at start-up of AR and DFlash servers of a dense model),
# never called on their paths: the EAGLE / tree-verify helpers.
ABSENT = ("verify_tree_greedy_cpu", "build_tree_kernel_efficient_cpu", "assign_draft_cache_locs_contiguous_cpu",
          "fill_bonus_tokens_cpu", "fill_accept_out_cache_loc_cpu")


def _absent(name: str):
    def op(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name}: the compiled CPU sgl-kernel is not installed; ddtree-bench's "
                                  "CPU shim provides only the ops SGLang's AR and DFlash paths call on a CPU")
    op.__name__ = name
    return op


globals().update(IMPLEMENTED)
globals().update({name: _absent(name) for name in ABSENT})
