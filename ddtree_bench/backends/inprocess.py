"""The in-process backend: the reference engine, called from the driver's event loop.

Requests run one at a time in a worker thread (the engine is batch-size-1); chat messages are
rendered with the model's chat template. Per-round chunks become the record's chunk timestamps, so
TTFT/ITL/TPOT mean the same thing as for servers (no network in between).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from ddtree_bench.config import RunSpec
from ddtree_bench.records import GenerationRequest, RequestRecord


class InProcessBackend:
    kind = "inprocess"

    def __init__(self, pair, method: str, budget: int, spec: RunSpec | None = None):
        self.pair = pair
        self.method = method
        self.budget = budget
        self.stop_ids = list(spec.stop_ids) if spec and spec.stop_ids is not None else pair.stop_ids
        self.block_size = pair.engine.block_size
        self._lock: asyncio.Lock | None = None  # made in start(): each drive() runs its own event loop

    @classmethod
    def from_spec(cls, spec: RunSpec) -> "InProcessBackend":
        from ddtree_bench.pair import load_pair

        return cls(load_pair(spec.model, spec.draft, spec.method, spec.dtype, spec.device, cuda_graphs=spec.cuda_graphs),
                   spec.method, spec.budget, spec)

    async def start(self) -> None:
        self._lock = asyncio.Lock()

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "method": self.method, "budget": self.budget, "stop_ids": self.stop_ids, **self.pair.info}

    def prompt_ids(self, req: GenerationRequest) -> list[int]:
        if req.prompt_ids is not None:
            return list(req.prompt_ids)
        return self.pair.tokenizer.apply_chat_template(req.messages)

    def generate_sync(self, req: GenerationRequest) -> RequestRecord:
        rec = RequestRecord(prompt_id=req.prompt_id, turn=req.turn)
        rec.t_send_ns = time.perf_counter_ns()
        try:
            ids = self.prompt_ids(req)
            rec.prompt_ids, rec.num_prompt_tokens = ids, len(ids)
            g = self.pair.engine.generate(
                ids, method=self.method, budget=self.budget, max_new_tokens=req.max_new_tokens,
                temperature=req.temperature, top_p=req.top_p, seed=req.seed, stop_ids=self.stop_ids,
            )
        except Exception as e:  # one bad request must not end the run
            rec.t_done_ns = time.perf_counter_ns()
            rec.error = f"engine: {type(e).__name__}: {e}"
            return rec
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
        return rec

    async def generate(self, req: GenerationRequest) -> RequestRecord:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            return await asyncio.to_thread(self.generate_sync, req)

    async def aclose(self) -> None:
        return None
