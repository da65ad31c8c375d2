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
falls back to "torch".
Batched rounds (gpu/batch_loop.py, buckets of 2+ slots) build every slot's tree at once: with
`batched_kernel(budget)` = "block" the one-block kernel over a grid of one program per slot
(kernels/tree_block.SlottedTreeBuilder, `checked_slotted`, the same check at the loop's slot count),
else ("torch") the exact batched PyTorch builder (batch_tree.BatchTreeBuilder). The rule, block up to
BATCH_BLOCK_MAX_BUDGET = 256: the slots run as parallel thread blocks, so a round's build costs about one tree's
one-block time, which the H200 measured at 0.15-0.29 ms up to B = 64 and ~1.3 ms at B = 256 (~6 ms at 1024),
against 1.65-3.30 ms for the exact batched builder at batch 2-16 already at B = 16. Measured in the batched loop
(H200, 2026-12-02 evening): 0.34 / 1.89 ms at batch 2 / 16, B = 16; 0.48 / 2.42 ms at B = 64. The price was cold
start: above AUTO_BLOCK_MAX_BUDGET the single loop never compiles the one-block kernel, so the first batched round
at B = 64 compiled it (14-20 s on a fresh Triton cache, 0.19 s in the next process; docs/gpu-performance.md,
"The night before"). There (`slotted_in_background`) the kernel now compiles on a daemon thread
(`start_slotted_compile` -> SlottedCompile: launches recorded on the caller's thread, only Triton's compile on the
other, the check back on the caller's) while the loop's first batched rounds use the exact batched builder; the loop
switches once it is compiled and checked (gpu/batch_loop.py; the H200's first batched round at B = 64 and 256 since:
docs/gpu-performance.md, "The night before"). Knows nothing of models, caches or rounds.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, field

import torch

from ddtree_bench.engine.tree_vector import StaticTreeBuilder

KERNELS = ("block", "grid", "grid-keys")      # the Triton builders
KINDS = ("auto",) + KERNELS + ("torch",)      # what FastLoop(tree_kernel=...) accepts
# auto's rule (why these budgets: docs/gpu-performance.md, "Cold start")
AUTO_BLOCK_MAX_BUDGET = 32    # the one-block kernel up to here
AUTO_GRID_MAX_BUDGET = 64     # then the grid without precomputed keys; grid-keys above
BATCH_BLOCK_MAX_BUDGET = 256  # batched rounds: the slotted one-block kernel up to here (why: module docstring)
CHECK_SLOTS_MAX = 16          # checked_slotted builds at most this many slots (the compiled kernels do not depend on it)
_COMPILING: dict[tuple, threading.Event] = {}   # SlottedCompile: (L, V, budget, device, dtype) -> the latest one's done


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
        logits = (torch.randn(*shape, generator=torch.Generator().manual_seed(budget)) * 3).to(device, d)
        warm(lambda: tb(logits), device)   # its kernels compiled at once, not one after another
        got = tb(logits)
        flagged = tb.flag.item() != 0
        tb.flag.zero_()
        if not flagged:
            break
    if not flagged and all(torch.equal(a, b) for a, b in zip(_parts(got), _parts(ref(logits)))):
        return None
    return "its certificate failed" if flagged else "its tree differs from the PyTorch builder's"


def _parts(trees) -> tuple:
    """(token_ids, parents, depths) of a builder's result: a tuple, or batch_tree.BatchTrees."""
    return (trees.token_ids, trees.parents, trees.depths) if hasattr(trees, "token_ids") else tuple(trees)


def batched_kernel(budget: int, kind: str = "auto") -> str:
    """The builder of a batched round (buckets of 2+ slots) at a budget: "block" (the slotted one-block kernel) or
    "torch" (the exact batched builder). kind is the loop's tree_kernel: auto follows BATCH_BLOCK_MAX_BUDGET, block
    forces the slotted kernel, torch the exact builder; grid / grid-keys have no slotted form (torch)."""
    if kind not in KINDS:
        raise ValueError(f"unknown tree kernel {kind!r}: {' | '.join(KINDS)}")
    if kind == "block" or (kind == "auto" and budget <= BATCH_BLOCK_MAX_BUDGET):
        return "block"
    return "torch"


def checked_slotted(L: int, V: int, budget: int, slots: int, device, dtype: torch.dtype = torch.float32, exact=None):
    """A kernels/tree_block.SlottedTreeBuilder for `slots` slots that compiled, ran and built the exact batched
    builder's trees (batch_tree.BatchTreeBuilder; `exact`, shared with the caller, or a new one) on random logits of
    `dtype`, a different [L, V] per slot (min(slots, CHECK_SLOTS_MAX) of them), here - else None with a warning, as
    checked_builder does for one tree."""
    from ddtree_bench.engine.gpu.batch_tree import BatchTreeBuilder
    from ddtree_bench.engine.gpu.kernels.tree_block import SlottedTreeBuilder, available
    from ddtree_bench.engine.gpu.kernels.warm import warm

    if not available(device):
        return None
    try:
        ref = exact if exact is not None else BatchTreeBuilder(L, V, budget, device)
        tb = SlottedTreeBuilder(L, V, budget, device, slots, exact=ref)
        error = _mismatch(tb, ref, (min(slots, CHECK_SLOTS_MAX), L, V), budget, device, dtype, warm)
        if error is None:
            return tb
    except Exception as e:  # pragma: no cover - needs a GPU
        error = f"{type(e).__name__}: {e}"
    _slotted_unusable(budget, slots, error)
    return None


def _slotted_unusable(budget: int, slots: int, error: str) -> None:
    warnings.warn(f"Triton slotted block tree kernel unusable at budget {budget} over {slots} slots, using the exact "
                  f"batched builder: {error}")


def slotted_in_background(budget: int, kind: str = "auto") -> bool:
    """Whether a batched loop compiles the slotted one-block kernel on a background thread (start_slotted_compile),
    its first batched rounds building with the exact batched builder meanwhile, rather than checking it before its
    first batched round (checked_slotted). True where batched rounds use the slotted kernel (batched_kernel = block)
    but the single loop's rule names another builder at this budget (auto above AUTO_BLOCK_MAX_BUDGET: grid or
    grid-keys), so no round of the process has compiled the one-block kernel at this budget, and its compile (11.4
    CPU-s for sm_90 at B = 64, 18 / 34 s at B = 128 / 256) would be the first batched round's wait: over the cold
    start's 10 s per new (bucket, budget) shape. Where the single loop uses the one-block kernel itself (auto up to
    AUTO_BLOCK_MAX_BUDGET, or tree_kernel block) the slotted launch is that same compiled kernel (tree_block.py), which
    its check compiles, so the synchronous check stays (nothing changes at B = 16)."""
    if batched_kernel(budget, kind) != "block":
        return False
    return (auto_kernel(budget) if kind == "auto" else kind) != "block"


class SlottedCompile:
    """The slotted one-block kernel compiled on a daemon thread while the caller's rounds build with the exact batched
    builder (slotted_in_background says where), then checked on the caller's thread.

    Made on the caller's (main) thread: it records the launches of one slotted build (kernels/warm.record: collecting,
    so no Triton kernel runs; the exact builder's log-probs do run, torch ops outside any capture), less the exact
    builder's own (its Triton top-K, which the exact rounds compile on the main thread anyway), and starts the thread,
    which only compiles them: `compile(launches, device)`, default warm.compile_launches (JITFunction.warmup: Triton's
    passes release the GIL and ptxas is a subprocess; no module load, no launch, no torch CUDA op, so the main thread
    may capture a CUDA graph meanwhile). ready() says whether the thread has finished (it never blocks); result(), on
    the main thread once ready, runs `check(L, V, budget, slots, device, dtype, exact=...)`, default checked_slotted
    (the same check as before the first round; fast now: the kernel is in Triton's in-memory cache), and returns its
    builder or None - a compile that raised gives None with checked_slotted's warning. Nothing joins the thread but
    wait(), for a caller outside any round (a benchmark that wants its measured rounds on the kernel): a daemon
    thread, so a process that ends first just leaves the compile out of Triton's cache. A compile of the same
    (L, V, budget, device, dtype) still running in the process (another loop's: a sweep's next batch size; the
    compiled kernel does not depend on the slot count) is waited for by the new thread before it compiles, which
    then finds the kernel in Triton's cache, instead of compiling it twice at once."""

    def __init__(self, L: int, V: int, budget: int, slots: int, device, dtype: torch.dtype = torch.float32, exact=None,
                 compile=None, check=None):
        from ddtree_bench.engine.gpu.batch_tree import BatchTreeBuilder
        from ddtree_bench.engine.gpu.kernels import warm

        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:   # the thread compiles for this device, not its own current one
            dev = torch.device("cuda", torch.cuda.current_device())
        self.L, self.V, self.budget, self.slots, self.device, self.dtype = L, V, budget, slots, dev, dtype
        self.exact = exact if exact is not None else BatchTreeBuilder(L, V, budget, dev)
        self.check = check if check is not None else checked_slotted
        self.error: str | None = None
        self.compiled = 0                  # launches handed to the thread
        self._done = threading.Event()
        self._taken = False
        self._builder = None
        self.thread: threading.Thread | None = None
        try:
            launches = self._record()
            warm.ready_driver(dev)
        except Exception as e:  # noqa: BLE001 - told by result(), as checked_slotted tells it
            self.error = f"{type(e).__name__}: {e}"
            self._done.set()
            return
        self.compiled = len(launches)
        run = compile if compile is not None else warm.compile_launches
        key = (L, V, budget, str(dev), dtype)
        before = _COMPILING.get(key)
        _COMPILING[key] = self._done
        self.thread = threading.Thread(target=self._compile, args=(run, launches, before), daemon=True,
                                       name=f"ddtree-slotted-compile-B{budget}")
        self.thread.start()

    def _record(self) -> list:
        """The slotted build's launches on one slot's zero logits (its kernel's variant does not depend on the slot
        count or the values), less the exact builder's own."""
        from ddtree_bench.engine.gpu.kernels.tree_block import SlottedTreeBuilder
        from ddtree_bench.engine.gpu.kernels.warm import record

        tb = SlottedTreeBuilder(self.L, self.V, self.budget, self.device, self.slots, exact=self.exact)
        logits = torch.zeros(1, self.L, self.V, dtype=self.dtype, device=self.device)
        theirs = {id(la.kernel) for la in record(lambda: self.exact.logprobs(logits))}
        return [la for la in record(lambda: tb(logits)) if id(la.kernel) not in theirs]

    def _compile(self, run, launches: list, before: threading.Event | None) -> None:
        try:
            if before is not None:   # the same kernel compiling for another loop: its result lands in the cache
                before.wait()
            run(launches, self.device)
        except Exception as e:  # noqa: BLE001 - told by result() on the main thread, never raised into a round
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self._done.set()

    def ready(self) -> bool:
        """The compile has finished (or failed); never blocks."""
        return self._done.is_set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until ready() or timeout_s passes (never in a round); returns ready()."""
        return self._done.wait(timeout_s)

    def result(self):
        """On the main thread once ready(): the checked slotted builder, or None (with a warning) where the compile
        or the check failed. The check runs once; later calls return its answer."""
        if not self.ready():
            raise RuntimeError("the slotted kernel is still compiling: call result() once ready()")
        if not self._taken:
            self._taken = True
            if self.error is None:
                try:
                    self._builder = self.check(self.L, self.V, self.budget, self.slots, self.device, self.dtype,
                                               exact=self.exact)
                except Exception as e:  # noqa: BLE001 - checked_slotted catches its own; a stand-in may not
                    self.error = f"{type(e).__name__}: {e}"
            if self.error is not None:
                _slotted_unusable(self.budget, self.slots, self.error)
        return self._builder


def start_slotted_compile(L: int, V: int, budget: int, slots: int, device, dtype: torch.dtype = torch.float32,
                          exact=None) -> SlottedCompile | None:
    """The slotted kernel's compile started on a background thread (SlottedCompile), or None where it cannot run here
    (tree_block.available: no Triton, not CUDA), as checked_slotted gives None there."""
    from ddtree_bench.engine.gpu.kernels.tree_block import available

    if not available(device):
        return None
    return SlottedCompile(L, V, budget, slots, device, dtype, exact)


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
