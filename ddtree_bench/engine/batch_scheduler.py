"""Continuous batching for callers on other threads: one engine thread runs a `batch.BatchLoop`.

`submit(request)` (any thread) checks the request, queues it and returns a
`concurrent.futures.Future` of its `Generation`. The engine thread, between rounds, retires
finished requests (resolving their futures: a result, or the exception that ended the request -
`batch.Cancelled`, an `on_chunk` error) and admits waiting ones in arrival order while the batch
has free slots; then it runs one round over everything active. A request's `on_chunk` runs on the
engine thread (callers hop back to their own loop, e.g. `loop.call_soon_threadsafe`). An error
inside a round (not attributable to one request) fails every request of that round and the
thread goes on with the next ones; if the loop cannot even end that round's requests (`fail_all`
raised), nothing it runs can be trusted: every request in flight or waiting fails with that error
and later `submit`s raise it, rather than waiting forever on a thread that is gone (`broken`).
The engine thread runs in torch's inference mode throughout (the loops' state is made in it; a step
would otherwise enter it every round). Idle, the thread sleeps on a condition; `close()` ends it
after the requests in flight (queued ones fail with `RuntimeError`).

A request that finds the batch empty and nobody else waiting runs through the loop's single-loop path when it has
one (`loop.run_alone`, BatchFastLoop's: `serve --max-batch 1`'s loop, without the batch's per-round bookkeeping),
which asks after every round whether others wait; when they do it hands the request over to the batch between two
rounds and the thread admits them and steps as above. So one client at a time is served as `--max-batch 1` serves
it, and a second one joins after at most one round of the first. When a step leaves one request and nobody waits,
it goes back to the single loop the same way (`loop.resume_alone`), so a request whose batch-mates ended is not
left paying the batch's step for its remaining rounds. `lone=False` turns both off (every round batched).

`stats` is the loop's `BatchStats` (rounds and how full each was), read by the backends for
summary.json. Knows the loop's API; nothing of HTTP or records.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future

import torch

from ddtree_bench.engine.batch import BatchLoop, BatchRequest, BatchStats


class BatchScheduler:
    def __init__(self, loop: BatchLoop, name: str = "ddtree-batch", lone: bool = True):
        self.loop = loop
        self.lone = lone and getattr(loop, "can_run_alone", False)   # a lone request takes loop.run_alone
        if self.lone:   # ... and one whose batch-mates ended goes back to it: loop.resume_alone after a step
            loop.lone_resumes = True
        # ... and hands over when others wait, unless the batch has no room for them (max_batch 1: it runs to its end)
        self._yield_to = self._others_wait if loop.max_batch > 1 else (lambda: False)
        self._cv = threading.Condition()
        self._waiting: deque[tuple[BatchRequest, Future]] = deque()
        self._futures: dict[int, Future] = {}
        self._closed = False
        self._broken: BaseException | None = None   # why the engine thread stopped (fail_all raised)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def stats(self) -> BatchStats:
        return self.loop.stats

    @property
    def broken(self) -> BaseException | None:
        """Why the engine thread stopped for good (its loop could not end a failed round's requests), else None."""
        return self._broken

    @property
    def max_batch(self) -> int:
        return self.loop.max_batch

    def submit(self, req: BatchRequest) -> Future:
        self.loop.check(req)  # bad requests fail here, in the caller's thread
        fut: Future = Future()
        with self._cv:
            if self._broken is not None:
                raise RuntimeError(f"the batch engine stopped after an error it could not recover from: {self._broken}")
            if self._closed:
                raise RuntimeError("the batch scheduler is closed")
            self._waiting.append((req, fut))
            self._cv.notify()
        return fut

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join()

    def _stop(self, why: BaseException) -> None:
        """The engine thread's last act after an unrecoverable error: fail every request it holds or that waits."""
        with self._cv:
            self._broken = why
            waiting = [fut for _, fut in self._waiting]
            self._waiting.clear()
        err = RuntimeError(f"the batch engine stopped: {why}")
        for fut in self._futures.values():
            if not fut.done():
                fut.set_exception(err)
        self._futures.clear()
        for fut in waiting:
            if fut.set_running_or_notify_cancel():
                fut.set_exception(err)

    def _others_wait(self) -> bool:
        """Asked by a lone request's loop after each round (read without the lock: a deque's length under the GIL)."""
        return bool(self._waiting)

    def _resolve(self, retired) -> None:
        for r in retired:
            fut = self._futures.pop(id(r.request), None)
            if fut is None:
                continue
            if r.error is not None:
                fut.set_exception(r.error)
            else:
                fut.set_result(r.generation)

    def _run(self) -> None:
        with torch.inference_mode():   # once for the thread: the loops' step then skips entering it every round
            self._serve()

    def _serve(self) -> None:
        loop = self.loop
        while True:
            with self._cv:
                while not self._waiting and not loop.active and not self._closed:
                    self._cv.wait()
                if self._closed and not loop.active:
                    pending = list(self._waiting)
                    self._waiting.clear()
                    break
                admit = []
                while self._waiting and len(admit) < loop.free_slots:
                    admit.append(self._waiting.popleft())
                alone = self.lone and len(admit) == 1 and not self._waiting and not loop.active
            for req, fut in admit:
                if not fut.set_running_or_notify_cancel():
                    continue
                self._futures[id(req)] = fut
                try:
                    done = loop.run_alone(req, self._yield_to) if alone else loop.admit(req)
                except Exception as e:  # its prefill failed: only this request ends
                    self._futures.pop(id(req), None)
                    fut.set_exception(e)
                    continue
                if done is not None:
                    self._resolve([done])
            if alone and loop.active:   # handed over because others wait: admit them before the next round
                continue
            try:
                self._resolve(loop.step(waiting=bool(self._waiting)))   # a hint: read without the lock
                if self.lone and not self._waiting and loop.can_resume_alone:
                    done = loop.resume_alone(self._yield_to)
                    if done is not None:
                        self._resolve([done])
            except Exception as e:  # the round's state is unknown: end its requests, keep serving
                try:
                    self._resolve(loop.fail_all(e))
                except Exception as stuck:   # ... unless even that fails: stop, and say why to every caller
                    self._stop(RuntimeError(f"{type(stuck).__name__}: {stuck} (ending a round that raised "
                                            f"{type(e).__name__}: {e})"))
                    return
        for _, fut in pending:
            if fut.set_running_or_notify_cancel():
                fut.set_exception(RuntimeError("the batch scheduler closed before this request ran"))
