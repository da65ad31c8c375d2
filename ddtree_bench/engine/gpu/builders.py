"""The tree-builder registry: every exact DDTree tree builder by name, a check that a Triton one
builds the PyTorch builder's tree here, and the choice of the fastest as a replayed CUDA graph.

Builders (all return the same (token_ids, parents, depths) [N] for the same draft logits [L, V]):
* "torch" - tree_vector.StaticTreeBuilder (runs anywhere; the exact fallback);
* "block" - kernels/tree_block.TritonTreeBuilder, one thread block (wins at small budgets);
* "grid" / "grid-keys" - kernels/tree_grid.GridTreeBuilder, ~30 small launches over the whole GPU,
  without / with precomputed keys (win at large budgets).
The Triton ones prune candidates and carry a certificate `flag`; a raised flag makes the loop redo
the round with "torch". `choose(..., kind="auto")` checks every Triton builder, times each
candidate with `graphs.replay_ms` and takes the fastest; where the crossover sits depends on the
GPU (docs/gpu-performance.md). Knows nothing of models, caches or rounds.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

from ddtree_bench.engine.tree_vector import StaticTreeBuilder

KERNELS = ("block", "grid", "grid-keys")      # the Triton builders
KINDS = ("auto",) + KERNELS + ("torch",)      # what FastLoop(tree_kernel=...) accepts
# auto never tries the one-block kernel above this budget: its per-depth sorts grow as B*ln(B) on one
# SM, so compiling and checking it there only delays the first round (docs/gpu-performance.md)
BLOCK_KERNEL_MAX_BUDGET = 256


@dataclass
class Choice:
    """The builder a budget uses, and (auto on CUDA) the ms per build of every candidate timed."""

    builder: object
    times_ms: dict[str, float] = field(default_factory=dict)


def make(kernel: str, L: int, V: int, budget: int, device):
    """An unchecked builder by name (kernel: block | grid | grid-keys | torch)."""
    if kernel == "torch":
        return StaticTreeBuilder(L, V, budget, device)
    if kernel == "block":
        from ddtree_bench.engine.gpu.kernels.tree_block import TritonTreeBuilder

        return TritonTreeBuilder(L, V, budget, device)
    if kernel in ("grid", "grid-keys"):
        from ddtree_bench.engine.gpu.kernels.tree_grid import GridTreeBuilder

        return GridTreeBuilder(L, V, budget, device, keys_first=kernel == "grid-keys")
    raise ValueError(f"unknown tree kernel {kernel!r}: {' | '.join(KINDS)}")


def checked_builder(L: int, V: int, budget: int, device, kernel: str = "block"):
    """A Triton builder for this (L, V, budget) that compiled, ran and matched the PyTorch builder on
    random logits here, or None (with a warning) - so a kernel that cannot build at some size
    (resources, a Triton version) costs speed, never a crash or a wrong tree."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown tree kernel {kernel!r}: {' | '.join(KERNELS)}")
    from ddtree_bench.engine.gpu.kernels.tree_block import available

    if not available(device):
        return None
    try:
        logits = torch.randn(L, V, generator=torch.Generator().manual_seed(budget)).to(device) * 3
        tb = make(kernel, L, V, budget, device)
        got = tb(logits)
        ref = StaticTreeBuilder(L, V, budget, device)(logits)
        if tb.flag.item() == 0 and all(torch.equal(a, b) for a, b in zip(got, ref)):
            return tb
        error = "its tree differs from the PyTorch builder's"
    except Exception as e:  # pragma: no cover - needs a GPU
        error = f"{type(e).__name__}: {e}"
    warnings.warn(f"Triton {kernel} tree kernel unusable at budget {budget}, using another builder: {error}")
    return None


def choose(L: int, V: int, budget: int, device, dtype: torch.dtype, kind: str = "auto") -> Choice:
    """The builder for a budget. kind auto: of the exact builders that pass their check here, the
    fastest as a replayed CUDA graph (the one-block kernel is not tried above BLOCK_KERNEL_MAX_BUDGET);
    block | grid | grid-keys | torch force one (a Triton one that fails its check falls back to torch)."""
    device = torch.device(device)
    if kind in KERNELS:
        return Choice(checked_builder(L, V, budget, device, kind) or make("torch", L, V, budget, device))
    if kind not in KINDS:
        raise ValueError(f"unknown tree kernel {kind!r}: {' | '.join(KINDS)}")
    if kind == "torch" or device.type != "cuda":
        return Choice(make("torch", L, V, budget, device))
    kernels = [k for k in KERNELS if k != "block" or budget <= BLOCK_KERNEL_MAX_BUDGET]
    cands = [b for b in (checked_builder(L, V, budget, device, k) for k in kernels) if b]
    if not cands:
        return Choice(make("torch", L, V, budget, device))
    from ddtree_bench.engine.gpu.graphs import replay_ms

    cands.append(make("torch", L, V, budget, device))
    probe = torch.randn(L, V, generator=torch.Generator().manual_seed(budget)).to(device, dtype)
    times = {b.name: replay_ms(lambda b=b: b(probe), reps=10) for b in cands}
    for b in cands:
        if hasattr(b, "flag"):
            b.flag.zero_()
    return Choice(min(cands, key=lambda b: times[b.name]), times)
