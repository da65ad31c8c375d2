"""The tree builders' choice (engine/gpu/builders.py) and its compiles, on a CPU, no GPU: the auto rule
names the builder the H200 measured fastest at every budget; the check builds in the rounds' dtype, so
a round (or a second check at the same budget) launches no kernel variant the check has not compiled;
a certificate raised on bf16 logits is checked again on fp32; warm() records launches instead of running
them and compiles each kernel function's launches in order on its own thread (kernels/warm.py); prefetched()
compiles the check's variants on a background thread while its block runs, and nothing where no check would.
Variants are keyed by Triton's own binder for sm_90 (kernels/variants.py)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from ddtree_bench.engine.gpu import builders
from ddtree_bench.engine.gpu.kernels import common
from ddtree_bench.engine.tree_vector import StaticTreeBuilder

ROOT = Path(__file__).resolve().parents[3]
NAMES = {"triton-block": "block", "triton-grid": "grid", "triton-grid-keys": "grid-keys"}
# H200 runs that timed every builder at every budget (CUDA-graph replay; docs/gpu-performance.md)
EVIDENCE = ["docs/measurements/2026-12-01/h200-b/roofline/bench_warm.json",   # Qwen3-8B shape, bf16
            "docs/measurements/2026-11-29/h200-h/call4/bench_toy.json"]        # toy pair, fp32


def _jit_kernels() -> bool:
    if common.triton is None:
        return False
    from triton.runtime.jit import JITFunction

    from ddtree_bench.engine.gpu.kernels import tree_grid

    return isinstance(tree_grid._rank_kernel, JITFunction)


jit_only = pytest.mark.skipif(not _jit_kernels(), reason="needs Triton's JIT kernels (installed, TRITON_INTERPRET unset)")


def test_auto_rule_follows_its_thresholds():
    for budget in (1, 8, 16, builders.AUTO_BLOCK_MAX_BUDGET):
        assert builders.auto_kernel(budget) == "block"
    for budget in (builders.AUTO_BLOCK_MAX_BUDGET + 1, 48, builders.AUTO_GRID_MAX_BUDGET):
        assert builders.auto_kernel(budget) == "grid"
    for budget in (builders.AUTO_GRID_MAX_BUDGET + 1, 128, 256, 512, 1024, 4096):
        assert builders.auto_kernel(budget) == "grid-keys"


@pytest.mark.parametrize("path", EVIDENCE)
def test_auto_rule_picks_the_builder_the_h200_measured_fastest(path):
    rounds = [r for r in json.loads((ROOT / path).read_text())["rounds"]
              if r["method"] == "ddtree" and (r["fast"].get("builder_ms") or {})]
    assert len(rounds) == 7
    for r in rounds:
        times = {NAMES[k]: v for k, v in r["fast"]["builder_ms"].items() if k in NAMES}
        assert builders.auto_kernel(r["budget"]) == min(times, key=times.get), (r["budget"], times)


class _Spy:
    """A Triton builder whose launches are recorded normally (warm) but whose real builds return the
    PyTorch builder's tree (no GPU here), raising the certificate on the dtypes in `flag_on`."""

    def __init__(self, inner, flag_on=()):
        self.inner, self.flag_on, self.dtypes = inner, set(flag_on), []
        self.name, self.N = inner.name, inner.N
        self.flag = torch.zeros(1, dtype=torch.int32)
        self.ref = StaticTreeBuilder(inner.L, inner.V, inner.budget, "cpu")

    def __call__(self, logits):
        from ddtree_bench.engine.gpu.kernels.warm import collecting

        if collecting():
            return self.inner(logits)
        self.dtypes.append(logits.dtype)
        self.flag.fill_(int(logits.dtype in self.flag_on))
        return self.ref(logits)


@pytest.fixture
def spied(monkeypatch):
    """checked_builder on this CPU as on a GPU: available, builders spied, warm() recording variants."""
    from ddtree_bench.engine.gpu.kernels import tree_block, warm
    from ddtree_bench.engine.gpu.kernels.variants import launched_variants

    made, warmed, flag_on = [], [], set()
    make = builders.make

    def spy(kernel, L, V, budget, device):
        if kernel == "torch":
            return make(kernel, L, V, budget, device)
        made.append(_Spy(make(kernel, L, V, budget, device), flag_on))
        return made[-1]

    monkeypatch.setattr(tree_block, "available", lambda device: True)
    monkeypatch.setattr(builders, "make", spy)
    monkeypatch.setattr(warm, "warm", lambda fn, device: warmed.append(set(launched_variants(fn))))
    return made, warmed, flag_on


@jit_only
@pytest.mark.parametrize("kernel", builders.KERNELS)
@pytest.mark.parametrize("budget", [8, 32])   # the top-K's two selections: min (K <= 16), threshold
def test_rounds_and_a_second_check_compile_nothing_the_check_did_not(spied, kernel, budget):
    from ddtree_bench.engine.gpu.kernels.variants import launched_variants

    made, warmed, _ = spied
    L, V = 4, 600
    assert builders.checked_builder(L, V, budget, "cpu", kernel, torch.bfloat16) is made[0]
    assert made[0].dtypes == [torch.bfloat16] and len(warmed) == 1
    b = made[0].inner
    for seed in range(2):   # rounds: other bf16 logits, same builder
        x = (torch.randn(L, V, generator=torch.Generator().manual_seed(100 + seed)) * 4).to(torch.bfloat16)
        assert set(launched_variants(lambda: b(x))) <= warmed[0]
    assert builders.checked_builder(L, V, budget, "cpu", kernel, torch.bfloat16) is made[1]
    assert warmed[1] <= warmed[0]
    x32 = torch.randn(L, V, generator=torch.Generator().manual_seed(7))
    assert not set(launched_variants(lambda: b(x32))) <= warmed[0]   # fp32 rounds would need other variants


@jit_only
def test_a_certificate_raised_on_bf16_logits_is_checked_again_on_fp32(spied):
    made, warmed, flag_on = spied
    flag_on.add(torch.bfloat16)
    assert builders.checked_builder(4, 600, 32, "cpu", "grid", torch.bfloat16) is made[0]
    assert made[0].dtypes == [torch.bfloat16, torch.float32] and made[0].flag.item() == 0
    flag_on.add(torch.float32)
    with pytest.warns(UserWarning, match="certificate failed"):
        assert builders.checked_builder(4, 600, 32, "cpu", "grid", torch.bfloat16) is None


@jit_only
def test_choose_on_a_cpu_compiles_nothing(spied):
    made, warmed, _ = spied
    for kind in ("auto", "torch"):
        assert builders.choose(4, 600, 32, "cpu", torch.bfloat16, kind).builder.name == "torch"
    assert made == [] and warmed == []


@jit_only
def test_warm_compiles_each_kernel_functions_launches_in_order_on_its_own_thread(monkeypatch):
    from triton.runtime.jit import JITFunction

    from ddtree_bench.engine.gpu.kernels import warm

    L = 4
    b = builders.make("grid-keys", L, 600, 64, "cpu")
    x = torch.randn(L, 600)
    launches = warm.record(lambda: b(x))   # on a CPU a kernel that ran would raise: none did
    assert not warm.collecting()
    assert len(launches) == 2 + 1 + 3 * (L - 1) + 4   # top-K (threshold), init, keys/rank/lex per depth, 4 after
    seen, lock = [], threading.Lock()
    both = threading.Barrier(2, timeout=10)
    firsts = {id(launches[0].kernel), id(next(la.kernel for la in launches if la.kernel is not launches[0].kernel))}

    def fake_warmup(kernel, *args, grid, **kwargs):
        with lock:
            seen.append((id(kernel), threading.get_ident(), grid))
            first = id(kernel) in firsts and sum(k == id(kernel) for k, _, _ in seen) == 1
        if first:
            both.wait()   # two kernel functions' first compiles at the same time, or a BrokenBarrierError

    monkeypatch.setattr(JITFunction, "warmup", fake_warmup)
    monkeypatch.setattr(warm.os, "cpu_count", lambda: 4)
    assert warm.warm(lambda: b(x), "cpu") == len(launches)
    assert len(seen) == len(launches)
    threads = {}
    for kernel_id, thread, _ in seen:
        threads.setdefault(kernel_id, set()).add(thread)
    assert all(len(t) == 1 for t in threads.values())       # one thread per kernel function
    for kernel_id in threads:                                  # each kernel's launches in launch order
        assert [g for k, _, g in seen if k == kernel_id] == [la.grid for la in launches if id(la.kernel) == kernel_id]


def test_batched_rounds_use_the_single_loops_kernel_at_every_budget():
    """auto: the kernel the single loop compiles at the budget (so batched rounds compile nothing more); a forced
    kind is forced in batched rounds too; make_slotted builds each one's slotted form."""
    for budget in (1, 16, 32, 33, 64, 65, 128, 256, 257, 512, 1024):
        assert builders.batched_kernel(budget) == builders.auto_kernel(budget)
    assert [builders.batched_kernel(b) for b in (16, 64, 256)] == ["block", "grid", "grid-keys"]
    for kind in ("block", "grid", "grid-keys", "torch"):
        assert builders.batched_kernel(16, kind) == kind == builders.batched_kernel(1024, kind)
    with pytest.raises(ValueError, match="tree kernel"):
        builders.batched_kernel(16, "heap")
    with pytest.raises(ValueError, match="slotted tree kernel"):
        builders.checked_slotted(4, 50, 16, 3, "cpu", kernel="torch")
    names = {k: builders.make_slotted(k, 4, 50, 16, "cpu", 3).name for k in builders.KERNELS}
    assert names == {"block": "triton-block-slotted", "grid": "triton-grid-slotted",
                     "grid-keys": "triton-grid-keys-slotted"}


class _SlottedStandIn:
    """A slotted builder on this CPU: the exact batched builder's trees (or, `wrong`, slot 0's tree in every slot),
    raising its flag on the dtypes in `flag_on`; records the logits it was checked on."""

    name = "triton-block-slotted"

    def __init__(self, L, V, budget, device, slots, exact=None, flag_on=(), wrong=False):
        self.exact, self.flag_on, self.wrong, self.slots, self.seen = exact, set(flag_on), wrong, slots, []
        self.flag = torch.zeros(1, dtype=torch.int32)

    def __call__(self, logits):
        from ddtree_bench.engine.gpu.batch_tree import BatchTrees
        from ddtree_bench.engine.gpu.kernels.warm import collecting

        if not collecting():
            self.seen.append(logits.clone())
            self.flag.fill_(int(logits.dtype in self.flag_on))
        t = self.exact(logits)
        if self.wrong:
            return BatchTrees(*(x[:1].expand_as(x).contiguous() for x in (t.token_ids, t.parents, t.depths)))
        return t


@pytest.mark.parametrize("case", ["passes", "bf16-flag", "always-flags", "wrong"])
def test_checked_slotted_builds_the_exact_trees_of_different_slots_or_falls_back(monkeypatch, case):
    from ddtree_bench.engine.gpu.kernels import tree_block, warm

    made = []
    flag_on = {"bf16-flag": {torch.bfloat16}, "always-flags": {torch.bfloat16, torch.float32}}.get(case, set())

    def stand_in(*a, **kw):
        made.append(_SlottedStandIn(*a, **kw, flag_on=flag_on, wrong=case == "wrong"))
        return made[-1]

    assert builders.checked_slotted(4, 50, 16, 3, "cpu", torch.bfloat16) is None   # a CPU: not available, no check
    monkeypatch.setattr(tree_block, "available", lambda device: True)
    monkeypatch.setattr(tree_block, "SlottedTreeBuilder", stand_in)
    monkeypatch.setattr(warm, "warm", lambda fn, device: None)
    if case in ("passes", "bf16-flag"):
        got = builders.checked_slotted(4, 50, 16, 20, "cpu", torch.bfloat16)
        assert got is made[0] and got.flag.item() == 0
        assert [x.dtype for x in got.seen] == [torch.bfloat16] + ([torch.float32] if flag_on else [])
        x = got.seen[0]
        assert x.shape == (builders.CHECK_SLOTS_MAX, 4, 50) and not torch.equal(x[0], x[1])   # different slots
    else:
        with pytest.warns(UserWarning, match="certificate failed" if case == "always-flags" else "differs"):
            assert builders.checked_slotted(4, 50, 16, 3, "cpu", torch.bfloat16) is None


def _recording_warmup(monkeypatch, block_first: threading.Barrier | None = None):
    """JITFunction.warmup replaced: each call appended as a warm.Launch with the calling thread; the very first
    waits at `block_first` (with the test's block) when given."""
    from triton.runtime.jit import JITFunction

    from ddtree_bench.engine.gpu.kernels import warm

    calls, lock = [], threading.Lock()

    def fake_warmup(kernel, *args, grid, **kwargs):
        with lock:
            first = not calls
            calls.append((warm.Launch(kernel, grid, args, kwargs), threading.get_ident()))
        if first and block_first is not None:
            block_first.wait()

    monkeypatch.setattr(JITFunction, "warmup", fake_warmup)
    return calls


@jit_only
@pytest.mark.parametrize("kernel", builders.KERNELS)
def test_prefetched_compiles_the_checks_variants_on_another_thread_while_its_block_runs(spied, monkeypatch, kernel):
    from ddtree_bench.engine.gpu.kernels.variants import variants_of

    made, warmed, _ = spied
    L, V, budget = 4, 600, 32
    both = threading.Barrier(2, timeout=10)
    calls = _recording_warmup(monkeypatch, both)
    with builders.prefetched(L, V, budget, "cpu", torch.bfloat16, kernel):
        both.wait()   # the prefetch's first compile is under way while the block runs, or BrokenBarrierError
    n = len(calls)
    assert n > 0 and threading.get_ident() not in {t for _, t in calls}
    assert builders.checked_builder(L, V, budget, "cpu", kernel, torch.bfloat16) is made[-1]
    assert len(calls) == n   # joined on leaving the block: nothing compiles after it
    assert set(variants_of([la for la, _ in calls])) == warmed[0]   # exactly what the check then warms


@jit_only
def test_prefetched_compiles_nothing_where_no_triton_builder_would_be_checked(spied, monkeypatch):
    made, _, _ = spied
    calls = _recording_warmup(monkeypatch)
    for kind in ("torch", "auto"):   # torch; auto off CUDA (choose builds with torch there)
        with builders.prefetched(4, 600, 16, "cpu", torch.bfloat16, kind):
            pass
    monkeypatch.setattr(builders, "PREFETCH", False)
    with builders.prefetched(4, 600, 16, "cpu", torch.bfloat16, "block"):
        pass
    assert calls == [] and made == []


@jit_only
def test_a_prefetch_compile_error_is_left_to_the_check(spied, monkeypatch):
    from triton.runtime.jit import JITFunction

    def broken(*args, **kwargs):
        raise RuntimeError("out of shared memory")

    raised = []
    monkeypatch.setattr(JITFunction, "warmup", broken)
    monkeypatch.setattr(threading, "excepthook", raised.append)   # where a thread's uncaught error would go
    with builders.prefetched(4, 600, 16, "cpu", torch.bfloat16, "block"):
        pass
    assert raised == []   # dropped: the check meets it again (and falls back to torch) on the main thread
