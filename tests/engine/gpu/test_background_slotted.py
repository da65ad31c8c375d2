"""The slotted one-block kernel compiled in the background (builders.slotted_in_background, SlottedCompile,
start_slotted_compile) and the batched fast loop's switch to it (batch_loop.BatchFastLoop._take_slotted), on a CPU.

The real compile needs CUDA, so the compile and the check are stand-ins given to SlottedCompile: a compile that
returns only when the test sets an Event (or raises), and a check that returns a stand-in slotted builder (the exact
batched builder's trees, its own name, a certificate flag raised with wrong trees on chosen calls, so the guarded
layout and the exact redo run after the switch). The recorded launches are the real slotted build's (recording runs
no kernel). Checked: which budgets go to the background; rounds before the compile ends use the exact builder,
unguarded; after it the buckets are made again with the stand-in (guarded, with fallback) and every request still
equals its batch-1 run and a loop that never switched, token for token (T = 0 and 0.8); a failed compile keeps the
exact builder with a warning and raises nothing into a round; the compile thread runs the compile alone (Triton's
warmup, nothing else of ours, nothing of torch.cuda); release() and ready() never wait for it. Where Triton can
run (CUDA, or TRITON_INTERPRET=1 on a CPU) one more test runs the real pipeline: thread, check, switch to the real
slotted kernel at B = 33.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from batch_support import FlakySlotted, alone, assert_same, make_requests, rnd  # noqa: F401 (fixture)
from engine_support import one_torch_thread  # noqa: F401 (fixture)
from triton_support import DEV, triton_only

from ddtree_bench.engine.gpu import builders
from ddtree_bench.engine.gpu.batch_loop import BatchFastLoop
from ddtree_bench.engine.gpu.batch_tree import BatchTreeBuilder
from ddtree_bench.engine.gpu.kernels import common, tree_block

pytestmark = pytest.mark.skipif(common.triton is None, reason="recording the slotted kernel's launch needs Triton")
BUDGET = 64    # above AUTO_BLOCK_MAX_BUDGET: the single loop never compiles the one-block kernel here
SLOTS = 3
RELEASE_AT, SWITCH_AFTER = 2, 4   # steps after which the loop is released / the compile is let go


class _Stand:
    """The compile and the check handed to SlottedCompile, and what they saw: the compile waits for `go` (then raises
    when `fail`), the check returns a FlakySlotted; each records the thread it ran on."""

    def __init__(self, fail: bool = False, flagged=()):
        self.go, self.fail, self.flagged = threading.Event(), fail, flagged
        self.compiled: list[tuple[threading.Thread, list]] = []
        self.checked: list[threading.Thread] = []
        self.made: list[FlakySlotted] = []
        self.jobs: list[builders.SlottedCompile] = []

    def compile(self, launches, device) -> None:
        self.compiled.append((threading.current_thread(), launches))
        assert self.go.wait(30), "the test never released the compile"
        if self.fail:
            raise RuntimeError("ptxas exited with status 1")

    def check(self, L, V, budget, slots, device, dtype, exact=None):
        self.checked.append(threading.current_thread())
        self.made.append(FlakySlotted(exact, self.flagged))
        return self.made[-1]

    def start(self, L, V, budget, slots, device, dtype, exact=None):   # builders.start_slotted_compile's stand-in
        self.jobs.append(builders.SlottedCompile(L, V, budget, slots, device, dtype, exact, compile=self.compile,
                                                 check=self.check))
        return self.jobs[-1]


def test_which_budgets_compile_in_the_background():
    """Only where batched rounds use the slotted kernel and the single loop's rule names another builder (auto above
    32, up to the batched rule's 256); tree_kernel block makes the single loop compile it (synchronous check), torch
    and the grid builders have no slotted form."""
    assert [b for b in (1, 16, 32, 33, 64, 128, 256, 257, 512, 1024) if builders.slotted_in_background(b)] == [33, 64, 128, 256]
    for kind in ("block", "torch", "grid", "grid-keys"):
        assert not any(builders.slotted_in_background(b, kind) for b in (16, 64, 256, 512)), kind
    with pytest.raises(ValueError, match="tree kernel"):
        builders.slotted_in_background(64, "heap")


def test_the_compile_thread_compiles_the_recorded_launch_and_nothing_else(monkeypatch):
    """The production compile (kernels/warm.compile_launches) on the thread, with Triton's warmup stood in for: the
    thread is a daemon, warmup gets the slotted build's one recorded launch (the one-block kernel over one program),
    and no other function of this package or of torch.cuda runs on that thread; the check runs on the caller's."""
    seen, calls = [], []
    monkeypatch.setattr(tree_block._tree_kernel, "warmup",
                        lambda *a, grid, **kw: seen.append((threading.current_thread(), grid, kw)))
    stand = _Stand()

    def tracer(frame, event, arg):
        if event == "call" and threading.current_thread().name.startswith("ddtree-slotted-compile"):
            calls.append((frame.f_code.co_filename, frame.f_code.co_name))

    exact = BatchTreeBuilder(15, 64, BUDGET, "cpu")
    threading.settrace(tracer)
    try:
        job = builders.SlottedCompile(15, 64, BUDGET, SLOTS, "cpu", torch.float32, exact, check=stand.check)
        assert job.wait(30)
    finally:
        threading.settrace(None)
    assert job.error is None and job.compiled == 1 and not job.thread.is_alive() and job.thread.daemon
    assert len(seen) == 1 and seen[0][0] is job.thread and seen[0][1] == (1,)
    assert seen[0][2]["L"] == 15 and seen[0][2]["N_OUT"] == BUDGET
    ours = {name for path, name in calls if "ddtree_bench" in path}
    assert ours == {"_compile", "compile_launches", "compile_chain"}, ours
    assert not any("torch/cuda" in path or "batch_tree" in path for path, _ in calls)
    assert job.result() is stand.made[0] and stand.checked == [threading.main_thread()]
    assert job.result() is stand.made[0] and len(stand.checked) == 1   # checked once


def test_ready_and_result_never_wait_and_a_failure_is_a_warning():
    """ready() is False while the compile runs and result() refuses (it would have to wait); a compile that raises
    gives None with checked_slotted's warning, the check never runs; a recording that raises (on the caller's
    thread) starts no thread and tells the same way."""
    stand = _Stand(fail=True)
    job = stand.start(15, 64, BUDGET, SLOTS, "cpu", torch.float32)
    t0 = time.perf_counter()
    assert not job.ready() and not job.wait(0.05)
    with pytest.raises(RuntimeError, match="still compiling"):
        job.result()
    assert time.perf_counter() - t0 < 5 and job.thread.is_alive()
    stand.go.set()
    assert job.wait(30)
    with pytest.warns(UserWarning, match="unusable at budget 64 over 3 slots.*ptxas exited"):
        assert job.result() is None
    assert stand.checked == [] and stand.compiled[0][0] is job.thread

    class Unbuildable(builders.SlottedCompile):
        def _record(self):
            raise ValueError("budget 64 is too large for the one-block tree kernel")

    stand = _Stand()
    job = Unbuildable(15, 64, BUDGET, SLOTS, "cpu", torch.float32, compile=stand.compile, check=stand.check)
    assert job.thread is None and job.ready() and stand.compiled == []
    with pytest.warns(UserWarning, match="too large"):
        assert job.result() is None


def test_a_second_compile_of_the_same_kernel_waits_for_the_first():
    """Two loops at one budget (a sweep's next batch size, another slot count): the second thread compiles only once
    the first has finished (then a cache hit in Triton), not the same kernel twice at once; another budget does not
    wait."""
    first, second, other = _Stand(), _Stand(), _Stand()
    second.go.set()
    other.go.set()
    a = first.start(15, 64, BUDGET, SLOTS, "cpu", torch.float32)
    b = second.start(15, 64, BUDGET, 8, "cpu", torch.float32)
    c = other.start(15, 64, BUDGET * 2, SLOTS, "cpu", torch.float32)
    assert c.wait(30) and other.compiled
    assert not b.wait(0.2) and second.compiled == [] and not a.ready()
    first.go.set()
    assert a.wait(30) and b.wait(30) and len(second.compiled) == 1 and second.compiled[0][0] is b.thread


def test_start_slotted_compile_needs_the_kernel_here():
    """Where the kernel cannot run (this CPU: tree_block.available is False) nothing starts, as checked_slotted gives
    None there; the batched loop then builds with the exact builder."""
    before = threading.active_count()
    assert builders.start_slotted_compile(15, 64, BUDGET, SLOTS, "cpu", torch.float32) is None
    assert threading.active_count() == before


def _held_run(loop, reqs, stand: _Stand, seen: dict):
    """loop.run(reqs) with the compile held: after step RELEASE_AT release() is called (it must not wait for the
    compile; the next round makes its stages again, with the exact builder); after step SWITCH_AFTER what the loop
    is like is noted in `seen` and the compile is let go and waited for, outside any round, so the next batched round
    switches; the step that switched notes which builder its bucket then had."""
    step, n = loop.step, [0]

    def held_step():
        out = step()
        n[0] += 1
        job = loop.slotted_compile
        if n[0] == RELEASE_AT:
            t0 = time.perf_counter()
            loop.release()
            seen.update(release_s=time.perf_counter() - t0, alive=job.thread.is_alive())
        if n[0] == SWITCH_AFTER:
            seen.update(pending=job is not None and not job.ready(), builder=loop.tree_builder,
                        buckets=[(bk.builder is loop.builder, bk.layout.guard, bk.fallback) for bk in loop._stages.values()],
                        batched=sum(r["bucket"] >= 2 for r in loop.rounds))
            stand.go.set()
            assert job.wait(30)
        if loop.slotted_from_round is not None and "switched" not in seen:
            seen["switched"] = loop._stages[loop.rounds[-1]["bucket"]].builder
        return out

    loop.step = held_step
    return loop.run(reqs)


@pytest.mark.parametrize("T", [0.0, 0.8], ids=["T0", "T0.8"])
def test_rounds_switch_to_the_compiled_kernel_and_keep_every_token(rnd, monkeypatch, T):
    """While the compile runs, batched rounds build with the exact builder (unguarded, no fallback); once it ends,
    the next batched round drops the batched buckets' stages and makes them with the stand-in slotted builder
    (guarded, exact fallback), which then builds every batched round (two of them flagged and redone). Every request
    equals its batch-1 run and a loop that never switched (the exact builder throughout), token for token."""
    stand = _Stand(flagged={1, 3})
    monkeypatch.setattr(builders, "start_slotted_compile", stand.start)
    reqs = make_requests(64, T, seed=21)
    loop = BatchFastLoop(rnd.target, rnd.proposer, "ddtree", BUDGET, SLOTS)
    seen: dict = {}
    got = _held_run(loop, reqs, stand, seen)
    assert len(stand.jobs) == 1 and seen["pending"] and seen["batched"] >= 2
    assert seen["builder"] == "torch-batched" and seen["buckets"]
    assert all(exact and not guard and fallback is None for exact, guard, fallback in seen["buckets"])
    assert seen["release_s"] < 1.0 and seen["alive"]   # release() left the compile running
    assert stand.compiled[0][0] is stand.jobs[0].thread and stand.checked == [threading.main_thread()]
    assert all(la.kernel is tree_block._tree_kernel for la in stand.compiled[0][1])   # only the slotted kernel
    k = loop.slotted_from_round
    assert loop.tree_builder == FlakySlotted.name and loop.slotted_compile is None and k is not None and k >= SWITCH_AFTER
    assert seen["switched"] is stand.made[0]   # the switching round's bucket was made again with the kernel
    assert stand.made[0].calls == sum(r["bucket"] >= 2 for r in loop.rounds[k:]) > 3   # every batched round after
    assert loop.redone_rounds == 2
    assert loop._stages and all(bk.builder is stand.made[0] and bk.layout.guard and bk.fallback is not None
                                for bk in loop._stages.values())
    never = BatchFastLoop(rnd.target, rnd.proposer, "ddtree", BUDGET, SLOTS, tree_kernel="torch")
    ref = never.run(reqs)
    assert never.tree_builder == "torch-batched" and never.slotted_compile is None
    for r, g, n in zip(reqs, got, ref):
        assert_same(g, n, ("never switched", T, r.key))
        assert_same(g, alone(rnd, "ddtree", BUDGET, r), ("batch 1", T, r.key))
        assert g.trees is not None and [t.token_ids for t in g.trees] == [t.token_ids for t in n.trees]


def test_a_failed_compile_keeps_the_exact_builder(rnd, monkeypatch):
    """A compile that raises on its thread: the next batched round warns and carries on with the exact builder (no
    check, no switch, nothing raised into the round), and every request still equals batch 1."""
    stand = _Stand(fail=True)
    monkeypatch.setattr(builders, "start_slotted_compile", stand.start)
    reqs = make_requests(64, 0.0, seed=22)
    loop = BatchFastLoop(rnd.target, rnd.proposer, "ddtree", BUDGET, SLOTS)
    seen: dict = {}
    with pytest.warns(UserWarning, match="unusable at budget 64.*ptxas exited"):
        got = _held_run(loop, reqs, stand, seen)
    assert seen["pending"] and stand.checked == [] and stand.made == []
    assert loop.tree_builder == "torch-batched" and loop.slotted_from_round is None and loop.slotted_compile is None
    assert loop.redone_rounds == 0 and all(bk.builder is loop.builder and not bk.layout.guard and bk.fallback is None
                                           for bk in loop._stages.values())
    for r, g in zip(reqs, got):
        assert_same(g, alone(rnd, "ddtree", BUDGET, r), ("failed compile", r.key))


def test_where_the_check_stays_synchronous(rnd, monkeypatch):
    """At B = 16 (the single loop's one-block budget) and with tree_kernel block the loop checks the slotted kernel
    before its first batched round, as before (no thread); at B = 64 on this CPU nothing can compile: the exact
    builder, no thread."""
    checked = []
    monkeypatch.setattr(builders, "checked_slotted", lambda *a, exact=None: checked.append(a[2]) or FlakySlotted(exact))
    monkeypatch.setattr(builders, "start_slotted_compile", lambda *a, **kw: pytest.fail("no background compile here"))
    for budget, kind in ((16, "auto"), (64, "block")):
        loop = BatchFastLoop(rnd.target, rnd.proposer, "ddtree", budget, SLOTS, tree_kernel=kind)
        assert loop._batch_builder().name == FlakySlotted.name and loop.slotted_compile is None
    assert checked == [16, 64]
    monkeypatch.undo()
    loop = BatchFastLoop(rnd.target, rnd.proposer, "ddtree", BUDGET, SLOTS)
    assert loop._batch_builder() is loop.builder and loop.slotted_compile is None and loop.tree_builder == "torch-batched"


@pytest.mark.gpu
@triton_only
def test_the_real_kernel_compiles_in_the_background_and_takes_over(monkeypatch):
    """The real pipeline where Triton can run (CUDA, or this CPU under TRITON_INTERPRET=1 with the kernel made
    available): start_slotted_compile's thread compiles the recorded launch (warm.compile_launches; the interpreter's
    warmup compiles nothing), checked_slotted checks the real slotted kernel on the main thread at the next batched
    round, the buckets switch to it at B = 33 (above the single loop's one-block budgets), and every request equals
    its batch-1 run."""
    from ddtree_bench.engine.batch import BatchRequest
    from ddtree_bench.engine.generate import Engine
    from ddtree_bench.engine.loading import random_pair

    if DEV == "cpu":
        monkeypatch.setattr(tree_block, "available", lambda device: True)
    target, drafter = random_pair(seed=1, vocab_size=3, block_size=4, device=DEV)
    plain = Engine(target, drafter)
    reqs = [BatchRequest([i % 3, 1, 2, 0, 1][: 2 + i], 12 + 3 * i, temperature=0.8 if i % 2 else 0.0, seed=60 + i, key=i)
            for i in range(4)]
    loop = BatchFastLoop(target, plain.proposer, "ddtree", 33, 3)
    step, jobs, used = loop.step, [], []

    def step_and_wait():   # the compile let finish between rounds, so the switch comes while requests remain
        out = step()
        b = loop.rounds[-1]["bucket"]
        if loop.slotted_from_round is not None and b in loop._stages:   # a batched round after the switch
            used.append(loop._stages[b].builder.name)
        if loop.slotted_compile is not None:
            jobs.append(loop.slotted_compile)
            assert loop.slotted_compile.wait(600)
        return out

    loop.step = step_and_wait
    got = loop.run(reqs)
    for r, g in zip(reqs, got):
        want = plain.generate(r.prompt_ids, "ddtree", 33, r.max_new_tokens, r.temperature, r.top_p, r.seed)
        assert (g.output_ids, g.accept_lengths) == (want.output_ids, want.accept_lengths), r.key
    assert jobs and jobs[0].error is None and jobs[0].compiled == 1 and not jobs[0].thread.is_alive()
    assert loop.tree_builder == "triton-block-slotted" and loop.slotted_from_round is not None
    assert used and set(used) == {"triton-block-slotted"}   # every batched round after the switch: the kernel
