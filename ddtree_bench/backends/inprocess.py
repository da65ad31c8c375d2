"""The in-process backend: the reference engine, called from the driver's event loop.

At concurrency 1 requests run one at a time in a worker thread on `Engine.generate` (batch 1).
At concurrency C > 1 they go to the batched engine (`engine.batch_scheduler.BatchScheduler`
over `engine.batch.BatchLoop`, up to C requests in flight, continuous batching), so the driver's
C concurrent requests - or its Poisson arrivals, up to C at once - really overlap; requests beyond
the batch wait in the engine's queue and that wait counts in their TTFT. The batch capacity is the
run's `--concurrency` (also with `--request-rate`, where it caps the batch). Each request keeps
its own seed (batch.py: its own generator), so outputs do not depend on who shares the batch.

With `--cuda-graphs` the batched loop is the batched fast loop (engine/gpu/batch_loop.BatchFastLoop:
fixed shapes, CUDA graphs per batch bucket and budget), except DDTree at budget 0, which the plain
BatchLoop runs; `describe()["batch_loop"]` (run.json) says which loop ran: "fast" | "plain", or
None at batch 1.
Each record's `server_stats["batch_sizes"]` lists the batch size of every round the request
took part in (metrics.batch_fullness turns them into summary.json's batch fullness).

Chat messages are rendered with the model's chat template. Per-round chunks become the record's
chunk timestamps, so TTFT/ITL/TPOT mean the same thing as for servers (no network in between).
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from ddtree_bench.run_spec import RunSpec
from ddtree_bench.records import GenerationRequest, RequestRecord


class InProcessBackend:
    kind = "inprocess"

    def __init__(self, pair, method: str, budget: int, spec: RunSpec | None = None):
        self.pair = pair
        self.method = method
        self.budget = budget
        self.stop_ids = list(spec.stop_ids) if spec and spec.stop_ids is not None else pair.stop_ids
        self.block_size = pair.engine.block_size
        self.concurrency = spec.concurrency if spec else 1
        self.request_rate = spec.request_rate if spec else None
        self.graphs = bool(getattr(pair.engine, "cuda_graphs", False))
        self.max_batch = max(1, self.concurrency)   # the batch the engine runs: the driver's concurrency
        self._lock: asyncio.Lock | None = None  # made in start(): each drive() runs its own event loop
        self._sched = None

    @classmethod
    def from_spec(cls, spec: RunSpec) -> "InProcessBackend":
        from ddtree_bench.pair import load_pair

        pair = load_pair(spec.model, spec.draft, spec.method, spec.dtype, spec.device, cuda_graphs=spec.cuda_graphs)
        from ddtree_bench.engine.interface import context_limit
        from ddtree_bench.errors import UsageError

        limit = context_limit(pair.engine.target)
        if limit and spec.max_new_tokens >= limit:   # no prompt fits: bad input, not a run of failed requests
            raise UsageError(f"--max-new-tokens {spec.max_new_tokens} leaves no room for a prompt in the model's context "
                             f"of {limit} tokens", hint=f"pass --max-new-tokens below {limit} minus the prompts' length")
        if spec.extra.get("target_variant"):   # a fault injection (engine/target_variants.py)
            from ddtree_bench.engine.target_variants import apply_to_pair

            apply_to_pair(pair, spec.extra["target_variant"])
        return cls(pair, spec.method, spec.budget, spec)

    async def start(self) -> None:
        self._lock = asyncio.Lock()
        if self.max_batch > 1 and self._sched is None:
            from ddtree_bench.engine.batch_scheduler import BatchScheduler

            self._sched = BatchScheduler(self.pair.engine.batch_loop(self.method, self.budget, self.max_batch))
        why = self.batching()["why"]
        if why and not self.batching()["honoured"]:
            print(f"warning: {why}", file=sys.stderr, flush=True)

    def batching(self) -> dict[str, Any]:
        """{max_batch, honoured, why}: whether the run's concurrency overlaps for real in the engine."""
        wanted = self.concurrency if self.request_rate is None else None
        return {"max_batch": self.max_batch, "honoured": True if wanted is not None else None, "why": None}

    def batch_loop(self) -> str | None:
        """Which batched loop serves the requests: "fast" (BatchFastLoop, with --cuda-graphs) | "plain"
        (BatchLoop) | None (batch 1: Engine.generate)."""
        if self.max_batch <= 1:
            return None
        if self._sched is not None:
            return self._sched.loop.kind
        return "fast" if self.graphs and (self.method != "ddtree" or self.budget > 0) else "plain"

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "method": self.method, "budget": self.budget, "stop_ids": self.stop_ids,
                "max_batch": self.max_batch, "batching": "continuous" if self.max_batch > 1 else "batch-1",
                "batch_loop": self.batch_loop(),
                **self.pair.info}

    def prompt_ids(self, req: GenerationRequest) -> list[int]:
        if req.prompt_ids is not None:
            return list(req.prompt_ids)
        return self.pair.tokenizer.apply_chat_template(req.messages)

    def _prompt(self, rec: RequestRecord, req: GenerationRequest) -> list[int]:
        """The prompt ids, recorded; ContextTooLong when they and max_new_tokens do not fit the target's context."""
        from ddtree_bench.engine.interface import check_context, context_limit

        ids = self.prompt_ids(req)
        rec.prompt_ids, rec.num_prompt_tokens = ids, len(ids)
        check_context(len(ids), req.max_new_tokens, context_limit(self.pair.engine.target))
        return ids

    def _fill(self, rec: RequestRecord, g, batch_sizes: list[int]) -> RequestRecord:
        rec.output_ids = g.output_ids
        rec.output_text = self.pair.tokenizer.decode(g.output_ids)
        rec.num_output_tokens = len(g.output_ids)
        rec.accept_lengths = g.accept_lengths
        rec.accept_lengths_source = "rounds"
        rec.finish_reason = g.finish_reason
        rec.t_first_token_ns = g.t_first_token_ns
        rec.t_done_ns = g.t_done_ns
        rec.chunk_times_ns, rec.chunk_tokens = g.chunk_times_ns, g.chunk_tokens
        rec.stage_ms = {k: v / 1e6 for k, v in g.stage_ns.items()}
        rec.server_stats = {"source": "inprocess", "batch_sizes": batch_sizes}
        return rec

    def _failed(self, rec: RequestRecord, e: Exception) -> RequestRecord:
        from ddtree_bench.engine.interface import ContextTooLong

        rec.t_done_ns = time.perf_counter_ns()
        rec.error = str(e) if isinstance(e, ContextTooLong) else f"engine: {type(e).__name__}: {e}"
        return rec

    def generate_sync(self, req: GenerationRequest) -> RequestRecord:
        rec = RequestRecord(prompt_id=req.prompt_id, turn=req.turn)
        rec.t_send_ns = time.perf_counter_ns()
        try:
            ids = self._prompt(rec, req)
            g = self.pair.engine.generate(
                ids, method=self.method, budget=self.budget, max_new_tokens=req.max_new_tokens,
                temperature=req.temperature, top_p=req.top_p, seed=req.seed, stop_ids=self.stop_ids,
            )
        except Exception as e:  # one bad request must not end the run
            return self._failed(rec, e)
        return self._fill(rec, g, [1] * len(g.accept_lengths))

    async def _generate_batched(self, req: GenerationRequest) -> RequestRecord:
        from ddtree_bench.engine.batch import BatchRequest

        rec = RequestRecord(prompt_id=req.prompt_id, turn=req.turn)
        rec.t_send_ns = time.perf_counter_ns()
        try:
            ids = self._prompt(rec, req)
            fut = self._sched.submit(BatchRequest(ids, req.max_new_tokens, req.temperature, req.top_p, req.seed, self.stop_ids))
            g = await asyncio.wrap_future(fut)
        except Exception as e:  # one bad request must not end the run
            return self._failed(rec, e)
        return self._fill(rec, g, list(g.batch_sizes))

    async def generate(self, req: GenerationRequest) -> RequestRecord:
        if self._sched is not None:
            return await self._generate_batched(req)
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            return await asyncio.to_thread(self.generate_sync, req)

    async def aclose(self) -> None:
        if self._sched is not None:
            sched, self._sched = self._sched, None
            await asyncio.to_thread(sched.close)
