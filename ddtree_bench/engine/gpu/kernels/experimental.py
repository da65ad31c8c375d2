"""GPU features that are off until named, and the integer settings an A/B varies.

DDTREE_GPU_EXPERIMENTAL is a comma-separated list of FEATURES, e.g. `DDTREE_GPU_EXPERIMENTAL=pdl,split-cap`;
`enabled(name)` says whether one is on. A feature leaves this list, and becomes the default, when an H200
run has shown it correct (its GPU tests) and faster (benchmarks/gpu_verify_ab.py: both arms in one process;
the figures go to docs/gpu-performance.md); one that was slower goes (l2-prefetch did), unless it is kept for a
re-measure on other GPUs, as the ones left are (slower on the H200: pdl at every n on 2026-12-02 and 04, split-cap at n = 64 on
2026-12-02, tree-fold by 2-5% at n = 64-128 on 2026-12-03; on an H100 pdl-late 0.6-1.2% faster at n <= 17 and 0.6-1.4%
slower at n = 65-256, pdl-bare slower at n = 16-17, 2026-12-05; bf16-partials 0.995-1.005x at n = 1-256 on an H100,
2026-12-05 night; tree-fold again 1.025-1.045x at n = 64-129 on an H100, 2026-12-06), or became one card's default
only (narrow-tiles, the H100's since 2026-12-06: 0.985-0.998x at n = 17-257 there, and the H200's since that night;
"narrow-off" turns it off, as pdl-off does the few-row pdl-late both cards take; cublaslt, the H100's since
2026-12-06 afternoon, "cublaslt-off"; mixed on the H200). A name not in
FEATURES is bad input (UsageError: exit 2 from the CLI).
KNOBS are integer settings whose constants came from such an A/B: `knob(name, default)` reads DDTREE_<NAME>
(a positive integer) or returns the constant the kernel passes, so the next A/B can move an edge without an
edit. Knows nothing of what the features do.
"""

from __future__ import annotations

import os
from functools import lru_cache

ENV = "DDTREE_GPU_EXPERIMENTAL"
GEMM_TABLE_ENV = "DDTREE_GEMM_TABLE"   # a JSON GEMM table (kernels/gemm.py) used on any CUDA device; named here, Triton-free
FEATURES = {
    "pdl": "programmatic dependent launch, with the weight GEMM's L2 prefetch (kernels/pdl.py)",
    "split-cap": "live attention's split-KV ranges capped on the device so their partials never outweigh the K/V (kernels/attention.py)",
    "tree-fold": "the tree kernel's split-KV combine folded into its launch (kernels/tree_attention.py)",
    "pdl-bare": "programmatic dependent launch without the L2 prefetch, the next kernel let in right after the wait (kernels/pdl.py)",
    "pdl-late": "programmatic dependent launch without the L2 prefetch, the next kernel let in after the main loop (kernels/pdl.py)",
    "pdl-off": "no programmatic dependent launch at all: not the H100's and H200's few-row pdl-late default, nor a PDL mode named beside it (kernels/pdl.py)",
    "bf16-partials": "split-KV partial sums kept in the activation dtype (bf16 / fp16), not fp32: half their traffic (kernels/attention.py)",
    "narrow-tiles": "the tree kernel's two lower bands in 32-wide key tiles, three stages, and two prefix ranges in its wide band, on any card (the H100's and H200's default; kernels/tree_attention.py)",
    "narrow-off": "the tree kernel keeps its table's 64-wide key tiles on an H100 / H200 too, not narrow-tiles' default there (kernels/tree_attention.py)",
    "cublaslt": "the weight GEMMs left to cuBLAS called through cuBLASLt, not cublasGemmEx, on any card (the H100's default; engine/gpu/ops.py)",
    "cublaslt-off": "the weight GEMMs left to cuBLAS called through cublasGemmEx on an H100 too, not cuBLASLt (engine/gpu/ops.py)",
    "grid-once": "the grid tree build's counting loops add their comparisons up elementwise and reduce once after the loop, not every step (kernels/tree_grid.py)",
}


KNOBS = {
    "COMBINE_ROWS_FROM": "folded rows from which the split-KV combine takes 16 rows per program (kernels/attention.py)",
    "COMBINE_ROW_WARPS": "warps per program of the split-KV combine's one-row programs, below COMBINE_ROWS_FROM folded rows (kernels/attention.py)",
    "TREE_RANGES_TO": "folded rows up to which the tree kernel splits the prefix in ranges (kernels/tree_attention.py)",
    "TREE_RANGES": "prefix ranges of the tree kernel up to TREE_RANGES_TO folded rows, every band but small trees over slots (kernels/tree_attention.py)",
    "TREE_WIDE_BLOCK_N": "key tile width of the tree kernel above TREE_RANGES_TO folded rows up to 1536 (kernels/tree_attention.py)",
    "TREE_BLOCK_N": "key tile width of the tree kernel, every band (kernels/tree_attention.py)",
    "TREE_WIDE_RANGES": "prefix ranges of the tree kernel above TREE_RANGES_TO folded rows up to 1536 (kernels/tree_attention.py)",
    "TREE_BIG_RANGES": "prefix ranges of the tree kernel above 1536 folded rows (default: n_split's count; kernels/tree_attention.py)",
    "TREE_BLOCK_M": "query rows per program of the tree kernel, every band (kernels/tree_attention.py)",
    "TREE_WARPS": "warps per program of the tree kernel, every band (kernels/tree_attention.py)",
    "TREE_STAGES": "software pipeline stages of the tree kernel in bf16 / fp16, every band (kernels/tree_attention.py)",
    "TREE_MAXNREG": "registers a thread the tree kernel may use, every band (ptxas .maxnreg; unset: ptxas's own count; kernels/tree_attention.py)",
    "RMSNORM_WARPS": "warps of the residual add + RMSNorm kernel's one-row programs (kernels/layer_ops.py)",
    "PDL_LATE_ROWS": "token rows up to which a launch takes pdl-late by default on an H100 SXM (kernels/pdl.py)",
    "ROPE_TILES_FROM": "tokens from which q/k norm + RoPE runs a tile of heads per program (kernels/layer_ops.py)",
    "SLOT_ROWS": "query rows per program of the live-slot kernel over 2+ slots, the batched loop's (kernels/attention.py)",
    "LIVE_BLOCK_N": "cache slots per inner step of the live-slot kernel (kernels/attention.py)",
    "LIVE_STAGES": "software pipeline stages of the live-slot kernel in bf16 / fp16 (kernels/attention.py)",
    "TREE_MIN_ROWS": "folded rows from which a tree verify takes the tree kernel (kernels/tree_attention.py)",
    "SLOT_TREE_MIN_ROWS": "the same over 2+ slots only (default: TREE_MIN_ROWS's; kernels/tree_attention.py)",
    "TREE_SLOT_RANGES": "prefix ranges a launch of small trees spreads over its 2+ slots (kernels/tree_attention.py)",
    "GRID_KEYS_BJ": "columns a step of the grid tree build's counting loops with precomputed keys, the large budgets' build (kernels/tree_grid.py)",
    "GRID_LEX_BJ": "columns a step of the grid tree build's lex loop (kernels/tree_grid.py)",
}


def knob(name: str, default: int, choices: tuple[int, ...] = ()) -> int:
    """DDTREE_<name> as a positive integer (one of `choices` where given: the sizes a kernel can tile), or `default`
    where unset; anything else is bad input (UsageError)."""
    if name not in KNOBS:
        raise KeyError(name)
    raw = os.environ.get(f"DDTREE_{name}", "")
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1 or (choices and int(raw) not in choices):
        from ddtree_bench.errors import UsageError

        want = f"one of {choices}" if choices else "a positive integer"
        raise UsageError(f"DDTREE_{name} must be {want}, got {raw!r}")
    return int(raw)


def check_knobs() -> None:
    """Every DDTREE_<KNOB> that is set is a positive integer (UsageError otherwise): what can be checked before a
    kernel reads it (the sizes a kernel can tile are checked where it reads them, `knob`'s choices)."""
    for name in KNOBS:
        knob(name, 1)


def requested() -> frozenset[str]:
    """The features DDTREE_GPU_EXPERIMENTAL names (checked against FEATURES); parsed once per value, since
    every kernel launch asks."""
    return _parse(os.environ.get(ENV, ""))


@lru_cache(maxsize=8)
def _parse(value: str) -> frozenset[str]:
    from ddtree_bench.errors import UsageError

    names = frozenset(n.strip() for n in value.split(",") if n.strip())
    unknown = names - FEATURES.keys()
    if unknown:
        raise UsageError(f"{ENV}: unknown feature(s) {', '.join(sorted(unknown))}; known: {', '.join(FEATURES)}")
    return names


def enabled(name: str) -> bool:
    """Whether experimental feature `name` (a key of FEATURES) is on."""
    if name not in FEATURES:
        raise KeyError(name)
    return name in requested()
