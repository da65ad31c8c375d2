"""What produces tokens behind `ddtree-bench serve`: the reference engine, or the null engine.

Both expose the same async stream of `Event`s for one `Job`: "tokens" events (a verify round's
committed tokens, as the engine's `on_chunk` hands them over), then one "done" (acceptance lengths,
finish reason, stage times), "error" or "cancelled".

* `EngineSource` runs `engine.generate.Engine` (batch size 1) on one dedicated worker thread; the
  server runs one job at a time (`serial = True`). With `max_batch` N > 1 (`serve --max-batch N`)
  it runs the batched engine instead (`engine.batch_scheduler.BatchScheduler`: continuous
  batching, up to N jobs in one batch, each with its own seed; over the batched fast loop a job that is
  alone runs through the single loop until another arrives) and the server runs up to N jobs at
  once (`serial = N`). Setting `job.cancelled` stops the generation at its next round (the
  `on_chunk` callback raises; batched, the job also leaves the batch between rounds), so a
  vanished client or a shutdown frees the engine (or its place in the batch) within one round.
* With `job.logprobs` = k, each "tokens" event carries every token's raw log-probability and the
  k most likely tokens (`LogprobScorer`: the target teacher-forced over the emitted tokens).
* `NullSource` needs no model: it answers instantly (or after `chunk_delay_s` per round) with
  `max_tokens` letters in chunks of `chunk_tokens` (one "round" each, a_r = chunk_tokens),
  concurrently (`serial = False`). It exists to measure the HTTP client and driver's own overhead.

`Scheduler` decides when a job runs: on a serial source (`serial` True, or an int N: N slots)
at most N jobs at a time in arrival order, at most `max_queue` waiting (more raise `QueueFull`);
a waiting job whose caller is cancelled (its client went away) leaves the queue at once and frees
its place. A concurrent source (`serial` False) runs every job at once.

Knows the engine's `generate` call and the toy byte tokenizer; nothing of HTTP.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from ddtree_bench import defaults as D


class _Cancelled(Exception):
    pass


@dataclass(eq=False)  # identity semantics: the server keeps the jobs in flight in a set
class Job:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_ids: list[int] = field(default_factory=list)
    logprobs: int | None = None  # None: none; k: each token's log-probability and the k most likely (0..20)
    cancelled: bool = False  # set by the server; the source stops at its next round
    outcome: str | None = None  # the finish reason the server counted for it (once)


@dataclass
class Event:
    kind: str                                  # "tokens" | "done" | "error" | "cancelled"
    tokens: list[int] = field(default_factory=list)
    t_ns: int = 0
    accept_lengths: list[int] | None = None    # done
    finish_reason: str | None = None           # done
    stage_ns: dict[str, int] | None = None     # done
    error: str | None = None                   # error
    logprobs: list["TokenLogprobs"] | None = None  # tokens, when the job asked for them: one per token


@dataclass
class TokenLogprobs:
    """One emitted token's raw log-probability (log_softmax of the target's logits, before any
    temperature or top-p) and the `top` most likely tokens at that position, best first."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


class LogprobScorer:
    """The target's log-probabilities of the tokens a request emits, by teacher forcing: its own KV
    cache holds the prompt and the tokens scored so far; each chunk of emitted tokens is one causal
    forward over [the previous token, the chunk's tokens but its last], whose rows are the
    distributions each token was picked from. The numbers equal the verify's own logits up to float
    rounding (another forward shape), whichever loop produced the tokens (plain, batched, CUDA
    graphs). Costs one small target forward per round. Runs on the engine's thread."""

    def __init__(self, target, prompt_ids: list[int], k: int, capacity: int):
        import torch

        self.target, self.k = target, k
        self.dev = target.lm_head.weight.device
        self.cache = target.new_cache(capacity)
        P = len(prompt_ids)
        if P > 1:
            with torch.inference_mode():
                target(torch.tensor(prompt_ids[:-1], device=self.dev), torch.arange(P - 1, device=self.dev), self.cache, 0,
                       last_logits_only=True)
        self.pending, self.pos = int(prompt_ids[-1]), P - 1

    def score(self, tokens: list[int]) -> list[TokenLogprobs]:
        import torch

        if not tokens:
            return []
        ids = [self.pending] + [int(t) for t in tokens[:-1]]
        with torch.inference_mode():
            logits, _ = self.target(torch.tensor(ids, device=self.dev),
                                    torch.arange(self.pos, self.pos + len(ids), device=self.dev), self.cache, self.pos)
            lp = torch.log_softmax(logits.float(), dim=-1)
            chosen = lp[torch.arange(len(tokens), device=self.dev), torch.tensor(tokens, device=self.dev)].tolist()
            top_v, top_i = lp.topk(self.k, dim=-1) if self.k else (lp[:, :0], lp[:, :0].long())
            top_v, top_i = top_v.tolist(), top_i.tolist()
        self.pending, self.pos = int(tokens[-1]), self.pos + len(ids)
        return [TokenLogprobs(int(t), float(c), list(zip(i, v))) for t, c, i, v in zip(tokens, chosen, top_i, top_v)]


class QueueFull(Exception):
    """No place left in the queue of a serial source."""

    def __init__(self, waiting: int, max_queue: int):
        super().__init__(f"the queue is full ({waiting} requests waiting, --max-queue {max_queue})")


class Scheduler:
    """When jobs run (see the module docstring). `on_change(waiting, running)` sees every change."""

    def __init__(self, serial: bool | int, max_queue: int, on_change: Callable[[int, int], None] | None = None):
        self.serial = bool(serial)
        self.slots = int(serial) if serial else 0  # jobs that may run at once (True = 1); 0 = unlimited
        self.max_queue = max_queue
        self.waiting = 0
        self.running = 0
        self._lock = asyncio.Semaphore(max(1, self.slots))  # FIFO: asyncio wakes waiters in arrival order
        self._on_change = on_change or (lambda waiting, running: None)

    def _changed(self) -> None:
        self._on_change(self.waiting, self.running)

    @asynccontextmanager
    async def turn(self):
        """Wait for this job's turn (cancellable: a cancelled waiter leaves the queue), then hold it."""
        if self.serial:
            if (self._lock.locked() or self.waiting) and self.waiting >= self.max_queue:
                raise QueueFull(self.waiting, self.max_queue)
            self.waiting += 1
            self._changed()
            try:
                await self._lock.acquire()
            finally:
                self.waiting -= 1
                self._changed()
        self.running += 1
        self._changed()
        try:
            yield
        finally:
            self.running -= 1
            self._changed()
            if self.serial:
                self._lock.release()


class EngineSource:
    """The reference engine of a loaded pair (`pair.load_pair`): one job at a time on a worker thread,
    or with max_batch > 1 up to max_batch jobs batched on the engine thread."""

    serial: bool | int = True
    logprobs = True  # answers `logprobs` (LogprobScorer)

    def __init__(self, pair, method: str, budget: int, model_id: str, max_batch: int = 1):
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.pair = pair
        self.max_batch = max_batch
        self.serial = max_batch  # the Scheduler runs up to this many jobs at once
        self.method = method
        self.budget = budget
        self.model_id = model_id
        self.tokenizer = pair.tokenizer
        self.stop_ids = list(pair.stop_ids)
        self.block_size = pair.engine.block_size
        cfg = pair.engine.target.cfg
        self.vocab_size = cfg.vocab_size
        self.max_model_len = cfg.max_position_embeddings
        self.info: dict[str, Any] = {"engine": "reference", "max_batch": max_batch, **pair.info}
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ddtree-engine")
        self._batch = None
        if max_batch > 1:
            from ddtree_bench.engine.batch_scheduler import BatchScheduler

            self._batch = BatchScheduler(pair.engine.batch_loop(method, budget, max_batch), name="ddtree-engine")
        self.info["batch_loop"] = self._batch.loop.kind if self._batch is not None else None   # fast | plain | None (batch 1)

    def failure(self) -> str | None:
        """Why this source can serve nothing more (/health answers 503 with it), else None: the batch engine's
        thread stopped after an error it could not recover from."""
        why = self._batch.broken if self._batch is not None else None
        return None if why is None else f"the batch engine stopped: {why}"

    def draft_tokens_per_round(self) -> int:
        return {"ddtree": self.budget, "dflash": self.block_size - 1}.get(self.method, 0)

    async def stream(self, job: Job) -> AsyncIterator[Event]:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()

        scorer: list[LogprobScorer] = []  # made on the engine's thread, at the first chunk

        def on_chunk(tokens: list[int]) -> None:
            if job.cancelled:
                raise _Cancelled
            t_ns = time.perf_counter_ns()
            lps = None
            if job.logprobs is not None:
                if not scorer:
                    scorer.append(LogprobScorer(self.pair.engine.target, job.prompt_ids, job.logprobs,
                                                len(job.prompt_ids) + job.max_tokens + 1))
                lps = scorer[0].score(list(tokens))
            loop.call_soon_threadsafe(events.put_nowait, Event("tokens", list(tokens), t_ns, logprobs=lps))

        def finished(g=None, exc: BaseException | None = None) -> None:
            from ddtree_bench.engine.batch import Cancelled

            if exc is None:
                ev = Event("done", t_ns=time.perf_counter_ns(), accept_lengths=g.accept_lengths,
                           finish_reason=g.finish_reason, stage_ns=g.stage_ns)
            elif isinstance(exc, (_Cancelled, Cancelled)):
                ev = Event("cancelled", t_ns=time.perf_counter_ns())
            else:  # one bad request must not take the server down
                ev = Event("error", t_ns=time.perf_counter_ns(), error=f"{type(exc).__name__}: {exc}")
            loop.call_soon_threadsafe(events.put_nowait, ev)

        def work() -> None:
            try:
                g = self.pair.engine.generate(
                    job.prompt_ids, method=self.method, budget=self.budget, max_new_tokens=job.max_tokens,
                    temperature=job.temperature, top_p=job.top_p, seed=job.seed, stop_ids=job.stop_ids, on_chunk=on_chunk)
            except Exception as e:
                finished(exc=e)
                return
            finished(g)

        if self._batch is not None:
            from ddtree_bench.engine.batch import BatchRequest

            req = BatchRequest(job.prompt_ids, job.max_tokens, job.temperature, job.top_p, job.seed, job.stop_ids,
                               on_chunk=on_chunk, cancelled=lambda: job.cancelled)

            def settle(f) -> None:
                e = f.exception()
                if e is not None:
                    finished(exc=e)
                else:
                    finished(f.result())

            try:
                bfut = self._batch.submit(req)
            except Exception as e:
                finished(exc=e)
                fut = loop.create_future()
                fut.set_result(None)
            else:
                bfut.add_done_callback(settle)
                fut = asyncio.wrap_future(bfut)
        else:
            fut = loop.run_in_executor(self._executor, work)
        try:
            while True:
                ev = await events.get()
                yield ev
                if ev.kind != "tokens":
                    return
        finally:
            job.cancelled = True  # no-op once done; otherwise stops the thread at its next round
            try:
                await asyncio.shield(fut)
            except Exception:  # the batched job's outcome already went out as an event
                pass

    def close(self) -> None:
        if self._batch is not None:
            self._batch.close()
        self._executor.shutdown(wait=True)


class NullSource:
    """Instant tokens, no model: for measuring the client and driver, not the engine."""

    serial = False
    method = "null"
    budget = 0
    logprobs = False  # no model, no log-probabilities

    def __init__(self, model_id: str = "null", chunk_tokens: int = D.NULL_CHUNK_TOKENS, chunk_delay_s: float = 0.0):
        from ddtree_bench.tokenizer import ChatTokenizer
        from ddtree_bench.toy.tokenizer import IM_END, VOCAB_SIZE, write_tokenizer

        if chunk_tokens < 1:
            raise ValueError("chunk_tokens must be >= 1")
        with tempfile.TemporaryDirectory(prefix="ddtree-bench-tok-") as tmp:
            write_tokenizer(Path(tmp))
            self.tokenizer = ChatTokenizer(tmp)
        self.model_id = model_id
        self.chunk_tokens = chunk_tokens
        self.chunk_delay_s = chunk_delay_s  # optional pause before each round (0: instant), to emulate an engine
        self.block_size = chunk_tokens
        self.stop_ids = [IM_END]
        self.vocab_size = VOCAB_SIZE
        self.max_model_len = 1 << 20
        self.info: dict[str, Any] = {"engine": "null", "chunk_tokens": chunk_tokens, "chunk_delay_s": chunk_delay_s}

    def draft_tokens_per_round(self) -> int:
        return self.chunk_tokens - 1

    @staticmethod
    def token(i: int) -> int:
        return ord("a") + i % 26  # the byte tokenizer's id of a letter

    async def stream(self, job: Job) -> AsyncIterator[Event]:
        yield Event("tokens", [self.token(0)], time.perf_counter_ns())  # the "prefill" token
        n, rounds = 1, []
        while n < job.max_tokens:
            if job.cancelled:
                yield Event("cancelled", t_ns=time.perf_counter_ns())
                return
            await asyncio.sleep(self.chunk_delay_s)  # 0: still yield, so a long instant stream cannot starve the loop
            take = min(self.chunk_tokens, job.max_tokens - n)
            rounds.append(self.chunk_tokens)  # a_r before truncation, as the engine counts it
            yield Event("tokens", [self.token(n + i) for i in range(take)], time.perf_counter_ns())
            n += take
        yield Event("done", t_ns=time.perf_counter_ns(), accept_lengths=rounds, finish_reason="length", stage_ns={})

    def close(self) -> None:
        return None
