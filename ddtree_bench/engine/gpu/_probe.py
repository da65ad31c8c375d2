"""The benchmarks' one entry to the GPU kernels' probe knobs - not a production API.

The production calls take no knobs: `kernels.topk.topk_logprobs_fused(logits, k)`,
`kernels.tree_grid.GridTreeBuilder(L, V, budget, device, keys_first)`,
`tree_vector.StaticTreeBuilder(L, V, budget, device)`. To measure why their constants are what they
are (docs/gpu-performance.md), benchmarks/gpu_probe_*.py and bench-engine vary them here:
* `topk(..., select, chunk, merge)`: the top-K's chunk selection ("min" | "threshold"), tokens per
  program, and the survivor merge ("triton" | "torch");
* `grid_builder(..., rows, bj, lex_bj, once)`: items each counting program of the grid tree build ranks, the
  columns its counting loops (rank, select) and its lex loop compare per step, and whether the counting loops
  reduce once after the loop rather than every step (the kernels' ONCE);
* `sorted_builder(...)`: the PyTorch builder with the plain loop's stable full sort for its top-K.
Knows nothing of models or rounds.
"""

from __future__ import annotations

from ddtree_bench.engine.gpu.kernels import topk as _topk_module
from ddtree_bench.engine.gpu.kernels.tree_grid import ROWS, GridTreeBuilder
from ddtree_bench.engine.tree_vector import SortedTreeBuilder

CHUNK = _topk_module.CHUNK


def topk(draft_logits, k: int, select: str | None = None, chunk: int = CHUNK, merge: str = "triton"):
    """The fused per-depth top-K with its knobs: (logprobs [L, k], ids [L, k])."""
    return _topk_module._topk(draft_logits, k, select=select, chunk=chunk, merge=merge)


def grid_builder(L: int, V: int, budget: int, device, keys_first: bool = False, rows: int = ROWS,
                 bj: int | None = None, lex_bj: int | None = None, once: bool = False) -> GridTreeBuilder:
    """A grid tree builder whose counting kernels rank `rows` items per program over `bj` columns a step (default
    the builder's: BJ, or BJ_KEYS with keys_first), its lex kernel `lex_bj` (default BJ), reducing once with `once`."""
    b = GridTreeBuilder(L, V, budget, device, keys_first=keys_first)
    b._rows, b._once = rows, once
    b.bj = b.bj if bj is None else bj
    b._lex_bj = b._lex_bj if lex_bj is None else lex_bj
    return b


def sorted_builder(L: int, V: int, budget: int, device) -> SortedTreeBuilder:
    """The PyTorch tree builder with a stable full sort for the top-K (the plain loop's way)."""
    return SortedTreeBuilder(L, V, budget, device)
