"""The request driver: schedules prompts onto a backend and collects one record per turn.

Load shapes: closed loop (`concurrency` conversations in flight) or open loop (Poisson arrivals
at `request_rate`/s on an absolute schedule computed up front, so a slow server delays nothing but
its own requests - no coordinated omission; `t_send_ns` is then the *scheduled* arrival time, so
queueing in the client counts as latency). Multi-turn prompts run turn by turn, each turn's
messages carrying the model's own earlier answers. Warmup requests run first and are not recorded.

Knows backends' protocol and records; nothing of models or trees.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence

from ddtree_bench.records import GenerationRequest, Prompt, RequestRecord


def poisson_schedule(n: int, rate: float, seed: int) -> list[float]:
    """Arrival offsets in seconds for n requests at `rate` per second (exponential gaps, seeded)."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


async def _run_conversation(backend, prompt: Prompt, index: int, *, max_new_tokens: int, temperature: float,
                            top_p: float, seed: int, t_send_ns: int | None = None) -> list[RequestRecord]:
    """All turns of one prompt; a failed turn ends the conversation (later turns are recorded as skipped)."""
    messages: list[dict[str, str]] = []
    records = []
    for turn, text in enumerate(prompt.turns):
        messages = messages + [{"role": "user", "content": text}]
        req = GenerationRequest(
            prompt_id=prompt.prompt_id, turn=turn, messages=messages,
            max_new_tokens=prompt.max_new_tokens or max_new_tokens,
            temperature=temperature, top_p=top_p, seed=seed + index * 16 + turn,
        )
        rec = await backend.generate(req)
        if turn == 0 and t_send_ns is not None and rec.t_send_ns is not None and rec.t_send_ns > t_send_ns:
            rec.t_send_ns = t_send_ns  # open loop: latency counts from the scheduled arrival
        records.append(rec)
        if not rec.ok:
            for t2 in range(turn + 1, len(prompt.turns)):
                records.append(RequestRecord(prompt_id=prompt.prompt_id, turn=t2, error="skipped: an earlier turn failed"))
            break
        messages = messages + [{"role": "assistant", "content": rec.output_text}]
    return records


async def drive(backend, prompts: Sequence[Prompt], *, max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                seed: int = 0, concurrency: int = 1, request_rate: float | None = None, warmup: int = 0,
                on_record: Callable[[RequestRecord], None] | None = None, progress: bool = True,
                desc: str = "requests") -> list[RequestRecord]:
    """Run every prompt (all turns) and return the records in completion order."""
    from tqdm.auto import tqdm

    await backend.start()
    for w in range(warmup if prompts else 0):  # short requests on the first prompt, not recorded
        warm = Prompt(prompts[0].prompt_id, prompts[0].turns[:1])
        await _run_conversation(backend, warm, 10_000 + w, max_new_tokens=min(16, max_new_tokens),
                                temperature=temperature, top_p=top_p, seed=seed)

    total = sum(len(p.turns) for p in prompts)
    bar = tqdm(total=total, desc=desc, unit="req", disable=not progress, leave=False)
    results: list[RequestRecord] = []

    def done(recs: list[RequestRecord]) -> None:
        for r in recs:
            results.append(r)
            if on_record is not None:
                on_record(r)
        bar.update(len(recs))
        errs = sum(1 for r in results if not r.ok)
        if errs:
            bar.set_postfix(errors=errs)

    kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
    try:
        if request_rate is None:
            queue: asyncio.Queue = asyncio.Queue()
            for i, p in enumerate(prompts):
                queue.put_nowait((i, p))

            async def worker() -> None:
                while not queue.empty():
                    i, p = queue.get_nowait()
                    done(await _run_conversation(backend, p, i, **kw))

            await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(prompts))))))
        else:
            offsets = poisson_schedule(len(prompts), request_rate, seed)
            t0 = time.perf_counter_ns()

            async def arrive(i: int, p: Prompt) -> None:
                at = t0 + int(offsets[i] * 1e9)
                delay = (at - time.perf_counter_ns()) / 1e9
                if delay > 0:
                    await asyncio.sleep(delay)
                done(await _run_conversation(backend, p, i, t_send_ns=at, **kw))

            await asyncio.gather(*(arrive(i, p) for i, p in enumerate(prompts)))
    finally:
        bar.close()
    return results
