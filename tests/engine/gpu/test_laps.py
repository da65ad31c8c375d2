"""The loops' round bookkeeping (gpu/loop.py): `Laps` (stage marks, read once, events reused through a pool),
`stream_now` (the current stream without torch.cuda.current_stream's per-call checks) and `ResultRing` (walk
results copied to pinned host memory). The CPU test runs everywhere; the CUDA ones check the events: reuse, the
stream they are recorded on (a stream context counts), and that a ticket waits for its own copy."""

from __future__ import annotations

import pytest
import torch

from ddtree_bench.engine.gpu.loop import SPENT_EVENTS_MAX, Laps, ResultRing, stream_now

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_laps_on_a_cpu_split_rounds_at_commit_and_read_once():
    laps = Laps(torch.device("cpu"))
    for name in ("begin", "draft", "verify", "commit", "verify", "walk", "commit"):
        laps.mark(name)
    rounds = laps.rounds()
    assert [sorted(r) for r in rounds] == [["commit", "draft", "verify"], ["commit", "verify", "walk"]]
    assert all(ms >= 0 for r in rounds for ms in r.values())
    assert laps.rounds() == [] and laps.marks == []   # read once: the marks are gone


def test_a_laps_that_begins_after_another_times_its_first_stage_from_that_ones_last_mark():
    cpu = torch.device("cpu")
    first = Laps(cpu)
    first.begin()                      # no `after`: a mark of its own
    first.mark("verify")
    first.mark("commit")
    second = Laps(cpu)
    second.begin(first)                # one round right after the other: first's commit is second's begin
    assert second.marks[0] == ("begin", first.marks[-1][1]) and first.handed_on
    second.mark("verify")
    second.mark("commit")
    third = Laps(cpu)
    third.begin(first)                 # first's last mark is handed on already: a mark of its own
    assert third.marks[0][1] >= second.marks[-1][1] and third.marks[0][1] != first.marks[-1][1]
    fourth = Laps(cpu)
    first.rounds()
    fourth.begin(first)                # first is read (no marks left): a mark of its own
    assert len(fourth.marks) == 1 and fourth.marks[0][0] == "begin"
    t_begin, t_verify = second.marks[0][1], second.marks[1][1]
    (r,) = second.rounds()
    assert set(r) == {"verify", "commit"} and r["verify"] == (t_verify - t_begin) / 1e6


@pytest.mark.gpu
@cuda
def test_a_handed_on_event_goes_back_to_the_pool_once_from_the_laps_that_began_with_it():
    dev = torch.device("cuda")
    pool: list = []
    first = Laps(dev, pool)
    first.begin()
    first.mark("verify")
    first.mark("commit")
    shared = first.marks[-1][1]
    second = Laps(dev, pool)
    second.begin(first)
    x = torch.ones(1 << 22, device=dev)
    for _ in range(20):
        x.mul_(1.0001)   # the second round's work, after the shared mark
    second.mark("verify")
    second.mark("commit")
    (r1,) = first.rounds()
    assert all(id(e) != id(shared) for e in pool) and len(pool) == 2   # first keeps its handed-on event out
    third = Laps(dev, pool)   # marks taken from the pool now must not overwrite the shared event
    third.begin()
    third.mark("commit")
    (r2,) = second.rounds()
    assert r2["verify"] > 0 and [id(e) for e in pool].count(id(shared)) == 1   # given back once, by second
    assert set(r1) == {"verify", "commit"}


@pytest.mark.gpu
@cuda
def test_laps_reuse_their_events_through_the_pool():
    dev = torch.device("cuda")
    pool: list = []
    first = Laps(dev, pool)
    for name in ("begin", "verify", "walk", "commit"):
        first.mark(name)
    made = [ev for _, ev in first.marks]
    (r,) = first.rounds()
    assert set(r) == {"verify", "walk", "commit"} and all(ms >= 0 for ms in r.values())
    assert [id(e) for e in pool] == [id(e) for e in made]
    second = Laps(dev, pool)
    x = torch.ones(1 << 20, device=dev)
    for name in ("begin", "verify", "walk", "commit"):
        x.mul_(1.0001)   # some work between marks
        second.mark(name)
    assert not pool and {id(ev) for _, ev in second.marks} == {id(e) for e in made}   # no event made
    (r2,) = second.rounds()
    assert all(ms > 0 for ms in r2.values())
    big = Laps(dev, pool)
    for i in range(SPENT_EVENTS_MAX + 10):
        big.mark("commit" if i % 2 else "begin")
    big.rounds()
    assert len(pool) == SPENT_EVENTS_MAX   # the pool keeps no more than its cap


@pytest.mark.gpu
@cuda
def test_stream_now_follows_stream_contexts_and_laps_time_work_on_their_stream():
    dev = torch.device("cuda")
    assert stream_now(dev) == torch.cuda.current_stream(dev)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert stream_now(dev) == side == torch.cuda.current_stream(dev)
        laps = Laps(dev)
        laps.mark("begin")
        torch.cuda._sleep(20_000_000)   # tens of ms of spinning on `side`
        laps.mark("commit")
    assert stream_now(dev) == torch.cuda.current_stream(dev) != side
    (r,) = laps.rounds()
    assert r["commit"] > 1.0   # the events saw the work queued on the side stream


@pytest.mark.gpu
@cuda
def test_result_ring_tickets_wait_for_their_own_copy_on_the_current_stream():
    dev = torch.device("cuda")
    ring = ResultRing(4, dev)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        src = torch.zeros(4, dtype=torch.long, device=dev)
        torch.cuda._sleep(20_000_000)   # the copy below can only start after this
        src.add_(7)
        ticket = ring.put(src)
    assert ticket.take() == [7, 7, 7, 7]
    ticket2 = ring.put(torch.arange(4, device=dev))
    assert ticket2.take() == [0, 1, 2, 3] and ticket.host.data_ptr() != ticket2.host.data_ptr()
