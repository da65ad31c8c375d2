"""The tree-builder registry: every exact DDTree tree builder by name, a check that a Triton one
builds the PyTorch builder's tree here, and the rule that picks one per budget.

Builders (all return the same (token_ids, parents, depths) [N] for the same draft logits [L, V]):
* "torch" - tree_vector.StaticTreeBuilder (runs anywhere; the exact fallback);
* "block" - kernels/tree_block.TritonTreeBuilder, one thread block (wins at small budgets);
* "grid" / "grid-keys" - kernels/tree_grid.GridTreeBuilder, ~30 small launches over the whole GPU,
  without / with precomputed keys (win at large budgets).
The Triton ones prune candidates and carry a certificate `flag`; a raised flag makes the loop redo
the round with "torch". `choose(..., kind="auto")` compiles and checks ONE Triton builder per budget,
the one `auto_kernel(budget)` names: "block" up to AUTO_BLOCK_MAX_BUDGET, "grid" up to
AUTO_GRID_MAX_BUDGET, "grid-keys" above. The rule follows the H200's timings of every builder at
every budget (CUDA-graph replay, Qwen3-8B shape and toy pair); it replaced compiling, checking and
timing every candidate at each new budget, which made a new budget's cold start mostly compiles
(docs/gpu-performance.md, "Cold start"). Another GPU may move the crossovers: bench-engine's build
table still times every builder per budget. The check compiles the builder's kernels concurrently
(kernels/warm.py) and builds in the rounds' dtype, so the rounds compile nothing more; a failed check
falls back to "torch". `prefetched(...)` starts those same compiles on a background thread, so that a loop's
other first-round work (the layer ops' and tree kernels' self-tests, the GEMM warms) runs while the builder
compiles (the one-block kernel alone takes 4-5 s), and the check then finds them compiled.
Batched rounds (gpu/batch_loop.py, buckets of 2+ slots) build every slot's tree at once with the SAME Triton
kernel the single loop's rule names at the budget, launched over the slots (`batched_kernel`, `make_slotted`,
`checked_slotted`: the same check at the loop's slot count): "block" - the one-block kernel over one program per
slot (kernels/tree_block.SlottedTreeBuilder), "grid" / "grid-keys" - every grid launch over a slot axis
(kernels/tree_grid.SlottedGridBuilder); "torch" - the exact batched PyTorch builder (batch_tree.BatchTreeBuilder),
also the fallback where a check fails. The compiled kernels are the single build's, so a process that ran a
single round at the budget compiles nothing more for its batched rounds, and one that did not compiles the grid
kernels in 1-5 s (the one-block kernel 9-47 s at B = 16-256, which is why it is not used above
AUTO_BLOCK_MAX_BUDGET). The same crossovers hold at every batch size: on the H200 (2026-12-03, bf16 Qwen3-8B draft
logits, CUDA-graph replays, docs/gpu-performance.md "Batched tree builds") the slotted block build wins up to B = 32
(0.18 vs 0.21 ms at batch 2, B = 16), the grid from B = 64 (0.31 vs 0.36 ms at batch 2, B = 64; 0.45 vs 1.22 ms
with keys at batch 2, B = 256) and grid-keys from B = 128; the exact builder takes 1.5-19 ms. Knows nothing of
models, caches or rounds.
"""

from __future__ import annotations

import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from ddtree_bench.engine.tree_vector import StaticTreeBuilder

KERNELS = ("block", "grid", "grid-keys")      # the Triton builders
KINDS = ("auto",) + KERNELS + ("torch",)      # what FastLoop(tree_kernel=...) accepts
# auto's rule (why these budgets: docs/gpu-performance.md, "Cold start")
AUTO_BLOCK_MAX_BUDGET = 32    # the one-block kernel up to here
AUTO_GRID_MAX_BUDGET = 64     # then the grid without precomputed keys; grid-keys above
CHECK_SLOTS_MAX = 16          # checked_slotted builds at most this many slots (the compiled kernels do not depend on it)
PREFETCH = True               # prefetched() compiles on a background thread (off: it does nothing; for cold-start A/Bs)


@dataclass
class Choice:
    """The builder a budget uses, and (auto on CUDA) its ms per build as a replayed CUDA graph (only the
    chosen builder is timed: no other one is compiled; bench-engine's build table times them all)."""

    builder: object
    times_ms: dict[str, float] = field(default_factory=dict)


def auto_kernel(budget: int) -> str:
    """The Triton builder auto uses at a budget (module docstring: the rule and its evidence)."""
    if budget <= AUTO_BLOCK_MAX_BUDGET:
        return "block"
    return "grid" if budget <= AUTO_GRID_MAX_BUDGET else "grid-keys"


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


def checked_builder(L: int, V: int, budget: int, device, kernel: str = "block", dtype: torch.dtype = torch.float32):
    """A Triton builder for this (L, V, budget) that compiled, ran and matched the PyTorch builder on
    random logits of `dtype` here, or None (with a warning) - so a kernel that cannot build at some size
    (resources, a Triton version) costs speed, never a crash or a wrong tree. Its kernels are compiled
    concurrently before the first build (kernels/warm.py). Checking in the rounds' dtype compiles only
    the top-K variants the rounds use; bf16's coarse logits can tie at a pruning boundary and raise the
    certificate, which proves nothing either way, so that case is checked again on fp32 logits."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown tree kernel {kernel!r}: {' | '.join(KERNELS)}")
    from ddtree_bench.engine.gpu.kernels.tree_block import available
    from ddtree_bench.engine.gpu.kernels.warm import warm

    if not available(device):
        return None
    try:
        tb = make(kernel, L, V, budget, device)
        error = _mismatch(tb, StaticTreeBuilder(L, V, budget, device), (L, V), budget, device, dtype, warm)
        if error is None:
            return tb
    except Exception as e:  # pragma: no cover - needs a GPU
        error = f"{type(e).__name__}: {e}"
    warnings.warn(f"Triton {kernel} tree kernel unusable at budget {budget}, using another builder: {error}")
    return None


def _mismatch(tb, ref, shape: tuple, budget: int, device, dtype: torch.dtype, warm) -> str | None:
    """None if builder `tb` compiled (concurrently, warm), ran and built `ref`'s trees on random logits of `shape`
    in `dtype` (again on fp32 when its certificate failed on `dtype`), else why not."""
    for d in dict.fromkeys([dtype, torch.float32]):
        logits = _check_logits(shape, budget, device, d)
        warm(lambda: tb(logits), device)   # its kernels compiled at once, not one after another
        got = tb(logits)
        flagged = tb.flag.item() != 0
        tb.flag.zero_()
        if not flagged:
            break
    if not flagged and all(torch.equal(a, b) for a, b in zip(_parts(got), _parts(ref(logits)))):
        return None
    return "its certificate failed" if flagged else "its tree differs from the PyTorch builder's"


def _check_logits(shape: tuple, budget: int, device, dtype: torch.dtype) -> torch.Tensor:
    """The random draft logits a builder is checked on (seeded by the budget): the check's and prefetched's."""
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(budget)) * 3).to(device, dtype)


@contextmanager
def prefetched(L: int, V: int, budget: int, device, dtype: torch.dtype, kind: str = "auto"):
    """Inside the block, the kernels of the Triton builder choose(L, V, budget, device, dtype, kind) will check
    compile on one background thread (kernels/warm.compile_launches, its own threads per kernel function), as the
    check's first build launches them (recorded here, on the same logits), so the caller's other cold work overlaps
    them; on leaving normally, the thread is joined and the check finds every variant in Triton's caches (leaving on
    an error, the daemon thread is left to finish or die with the process). A compile error
    there is dropped: the check meets it again and falls back. Nothing is compiled for torch, off CUDA under auto
    (choose builds with torch there), where tree_block.available says no, or with PREFETCH off. Only Triton runs
    on the thread (no launch, no torch CUDA op), so the block may run kernels; it must not capture a CUDA graph."""
    from ddtree_bench.engine.gpu.kernels import tree_block, warm

    device = torch.device(device)
    kernel = auto_kernel(budget) if kind == "auto" else kind
    go = (PREFETCH and kernel in KERNELS and (kind != "auto" or device.type == "cuda")
          and tree_block.available(device))
    thread = None
    if go:
        logits = _check_logits((L, V), budget, device, dtype)
        launches = warm.record(lambda: make(kernel, L, V, budget, device)(logits))
        if launches:
            warm.ready_driver(device)

            def compile_quietly() -> None:
                try:
                    warm.compile_launches(launches, device)
                except Exception:  # noqa: BLE001 - the check compiles again and reports it
                    pass

            thread = threading.Thread(target=compile_quietly, name="ddtree-builder-prefetch", daemon=True)
            thread.start()
    yield
    if thread is not None:
        thread.join()


def _parts(trees) -> tuple:
    """(token_ids, parents, depths) of a builder's result: a tuple, or batch_tree.BatchTrees."""
    return (trees.token_ids, trees.parents, trees.depths) if hasattr(trees, "token_ids") else tuple(trees)


def batched_kernel(budget: int, kind: str = "auto") -> str:
    """The builder of a batched round (buckets of 2+ slots) at a budget: a Triton kernel over the slots (block | grid
    | grid-keys) or "torch" (the exact batched builder). kind is the loop's tree_kernel: auto follows the single
    loop's rule (auto_kernel; why the same at every batch size: module docstring), a Triton kernel or torch forces
    it."""
    if kind not in KINDS:
        raise ValueError(f"unknown tree kernel {kind!r}: {' | '.join(KINDS)}")
    return auto_kernel(budget) if kind == "auto" else kind


def make_slotted(kernel: str, L: int, V: int, budget: int, device, slots: int, exact=None):
    """An unchecked slotted builder for `slots` slots by name (block | grid | grid-keys), on `exact`'s log-probs."""
    if kernel == "block":
        from ddtree_bench.engine.gpu.kernels.tree_block import SlottedTreeBuilder

        return SlottedTreeBuilder(L, V, budget, device, slots, exact=exact)
    if kernel in ("grid", "grid-keys"):
        from ddtree_bench.engine.gpu.kernels.tree_grid import SlottedGridBuilder

        return SlottedGridBuilder(L, V, budget, device, slots, exact=exact, keys_first=kernel == "grid-keys")
    raise ValueError(f"unknown slotted tree kernel {kernel!r}: {' | '.join(KERNELS)}")


def checked_slotted(L: int, V: int, budget: int, slots: int, device, dtype: torch.dtype = torch.float32, exact=None,
                    kernel: str = "block"):
    """A slotted Triton builder (make_slotted: `kernel` over `slots` slots) that compiled, ran and built the exact
    batched builder's trees (batch_tree.BatchTreeBuilder; `exact`, shared with the caller, or a new one) on random
    logits of `dtype`, a different [L, V] per slot (min(slots, CHECK_SLOTS_MAX) of them), here - else None with a
    warning, as checked_builder does for one tree."""
    from ddtree_bench.engine.gpu.batch_tree import BatchTreeBuilder
    from ddtree_bench.engine.gpu.kernels.tree_block import available
    from ddtree_bench.engine.gpu.kernels.warm import warm

    if kernel not in KERNELS:
        raise ValueError(f"unknown slotted tree kernel {kernel!r}: {' | '.join(KERNELS)}")
    if not available(device):
        return None
    try:
        ref = exact if exact is not None else BatchTreeBuilder(L, V, budget, device)
        tb = make_slotted(kernel, L, V, budget, device, slots, exact=ref)
        error = _mismatch(tb, ref, (min(slots, CHECK_SLOTS_MAX), L, V), budget, device, dtype, warm)
        if error is None:
            return tb
    except Exception as e:  # pragma: no cover - needs a GPU
        error = f"{type(e).__name__}: {e}"
    warnings.warn(f"Triton slotted {kernel} tree kernel unusable at budget {budget} over {slots} slots, using the "
                  f"exact batched builder: {error}")
    return None


def choose(L: int, V: int, budget: int, device, dtype: torch.dtype, kind: str = "auto") -> Choice:
    """The builder for a budget, checked on `dtype` logits (the rounds'). kind auto on CUDA: the Triton
    builder auto_kernel(budget) names, if it passes its check here (else torch), timed as a replayed
    CUDA graph; block | grid | grid-keys | torch force one (a Triton one that fails its check falls back
    to torch). No other Triton builder is compiled."""
    device = torch.device(device)
    if kind in KERNELS:
        return Choice(checked_builder(L, V, budget, device, kind, dtype) or make("torch", L, V, budget, device))
    if kind not in KINDS:
        raise ValueError(f"unknown tree kernel {kind!r}: {' | '.join(KINDS)}")
    if kind == "torch" or device.type != "cuda":
        return Choice(make("torch", L, V, budget, device))
    b = checked_builder(L, V, budget, device, auto_kernel(budget), dtype)
    if b is None:
        return Choice(make("torch", L, V, budget, device))
    from ddtree_bench.engine.gpu.graphs import replay_ms

    probe = torch.randn(L, V, generator=torch.Generator().manual_seed(budget)).to(device, dtype)
    times = {b.name: replay_ms(lambda: b(probe), reps=10)}
    b.flag.zero_()
    return Choice(b, times)
