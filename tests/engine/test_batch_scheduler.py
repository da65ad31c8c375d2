"""BatchScheduler's engine thread when rounds fail (batch_scheduler.py): a round that raises ends its requests
and the thread serves the next ones; a loop that cannot even end them (its fail_all raises) stops the thread, and
then every request held or waiting fails with that reason and later submits raise it - nothing waits forever.
A scripted loop stands in for the engine (the scheduler knows only the loop's API)."""

from __future__ import annotations

import threading

import pytest

from ddtree_bench.engine.batch import BatchRequest, BatchStats, Retired
from ddtree_bench.engine.batch_scheduler import BatchScheduler


class ScriptedLoop:
    """Admits up to max_batch requests; each step retires them all with a result, except while `fail` is set: then
    step raises, and fail_all raises too when `fail_all_raises`. `gate` (when set) holds the first step until
    released, so that requests can be made to wait."""

    def __init__(self, max_batch: int = 1):
        self.max_batch, self.active, self.stats = max_batch, [], BatchStats(max_batch)
        self.fail, self.fail_all_raises, self.gate = False, False, None

    @property
    def free_slots(self) -> int:
        return self.max_batch - len(self.active)

    def check(self, req) -> None:
        pass

    def admit(self, req):
        self.active.append(req)
        return None

    def step(self, waiting: bool = False):
        if self.gate is not None:
            self.gate.wait(30)
        if self.fail:
            raise RuntimeError("round exploded")
        done, self.active = [Retired(r, "ok:" + str(r.key)) for r in self.active], []
        return done

    def fail_all(self, error):
        if self.fail_all_raises:
            raise RuntimeError("buffers unreachable")
        done, self.active = [Retired(r, None, error) for r in self.active], []
        return done


def req(key: int) -> BatchRequest:
    return BatchRequest([1, 2, 3], 4, key=key)


def test_a_round_that_raises_ends_its_requests_and_the_next_are_served():
    loop = ScriptedLoop()
    sched = BatchScheduler(loop)
    try:
        loop.fail = True
        with pytest.raises(RuntimeError, match="round exploded"):
            sched.submit(req(1)).result(timeout=10)
        loop.fail = False
        assert sched.submit(req(2)).result(timeout=10) == "ok:2"
    finally:
        sched.close()


def test_when_even_fail_all_raises_every_request_fails_with_the_reason_and_later_submits_raise():
    loop = ScriptedLoop(max_batch=1)
    loop.fail, loop.fail_all_raises, loop.gate = True, True, threading.Event()
    sched = BatchScheduler(loop)
    running = sched.submit(req(1))
    waiting = sched.submit(req(2))   # no free slot: it waits
    loop.gate.set()
    for fut in (running, waiting):
        with pytest.raises(RuntimeError, match="batch engine stopped: RuntimeError: buffers unreachable .*round exploded"):
            fut.result(timeout=10)
    with pytest.raises(RuntimeError, match="could not recover from.*buffers unreachable"):
        sched.submit(req(3))
    sched.close()   # returns: the thread is gone, nothing to wait for
