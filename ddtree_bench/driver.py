"""The request driver: schedules prompts onto a backend and collects one record per turn.

Load shapes:
* closed loop (`concurrency` = C): C workers, each takes the next conversation as soon as its
  previous one finished. Nothing waits in the client, so `t_send_ns` is when the request left.
* open loop (`request_rate` = R/s): conversation i arrives at `t0 + offsets[i]`, a Poisson schedule
  (seeded exponential gaps) computed up front and slept towards on the absolute clock, so a slow
  response delays nothing but itself - no coordinated omission. The record's `t_send_ns` is the
  *scheduled* arrival, so any lag in the client (event loop, connection setup) counts as latency;
  `t_dispatch_ns` is when the request actually left (their difference is the client's lag).
Multi-turn prompts run turn by turn, each turn's messages carrying the model's own earlier answers;
later turns of a conversation are sent as soon as the previous turn finished. Warmup requests
(short, on the first prompt) run before the clock starts and are not recorded; if every warmup
request fails, one request on each of the next prompts tells a bad first prompt from a bad deployment,
and only when they fail too does the run stop with `UsageError` (bad URL, model name, key: exit 2)
before anything is measured. A backend exception inside one request becomes that request's `error`, never a crash.

`drive` owns the backend's connection for one call: `start()` before the first request (where an
unreachable server raises `UsageError`), `aclose()` after the last, so a backend object can be
driven again from a new event loop (sweeps).

Knows backends' protocol and records; nothing of models, trees or HTTP.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Callable, Sequence

from ddtree_bench.errors import UsageError
from ddtree_bench.records import GenerationRequest, Prompt, RequestRecord

WARMUP_MAX_NEW_TOKENS = 16
WARMUP_PROBES = 3   # prompts tried (the first, then one request each) before a failed warmup ends the run


def poisson_schedule(n: int, rate: float, seed: int) -> list[float]:
    """Arrival offsets in seconds for n requests at `rate` per second: 0, then cumulative
    exponential gaps of mean 1/rate (seeded, so a run's schedule is reproducible)."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


async def _generate(backend, req: GenerationRequest) -> RequestRecord:
    """backend.generate, with any exception turned into an error record (one bad request never ends a run)."""
    try:
        rec = await backend.generate(req)
    except (asyncio.CancelledError, KeyboardInterrupt, UsageError):
        raise
    except Exception as e:  # a backend bug: record it and keep going
        now = time.perf_counter_ns()
        rec = RequestRecord(prompt_id=req.prompt_id, turn=req.turn, t_send_ns=now, t_done_ns=now,
                            error=f"client: {type(e).__name__}: {e}")
    if rec.t_dispatch_ns is None:
        rec.t_dispatch_ns = rec.t_send_ns
    return rec


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
        rec = await _generate(backend, req)
        if turn == 0 and t_send_ns is not None and rec.t_send_ns is not None and rec.t_send_ns > t_send_ns:
            rec.t_send_ns = t_send_ns  # open loop: latency counts from the scheduled arrival
        records.append(rec)
        if not rec.ok:
            for t2 in range(turn + 1, len(prompt.turns)):
                records.append(RequestRecord(prompt_id=prompt.prompt_id, turn=t2, error="skipped: an earlier turn failed"))
            break
        messages = messages + [{"role": "assistant", "content": rec.output_text}]
    return records


async def _warmup(backend, prompts: Sequence[Prompt], n: int, parallel: int, *, max_new_tokens: int, temperature: float,
                  top_p: float, seed: int) -> None:
    """n short single-turn requests on the first prompt, up to `parallel` at once (opens the connections the
    measured requests will reuse). When all of them fail, one request on each of the next WARMUP_PROBES - 1
    prompts tells a bad prompt (say, one over the context: it fails again in the measured run, as that
    request's error) from a bad deployment: UsageError only when every prompt tried failed."""
    sem = asyncio.Semaphore(max(1, parallel))
    kw = dict(max_new_tokens=min(WARMUP_MAX_NEW_TOKENS, max_new_tokens), temperature=temperature, top_p=top_p, seed=seed)

    async def one(prompt: Prompt, w: int) -> list[RequestRecord]:
        async with sem:
            return await _run_conversation(backend, Prompt(prompt.prompt_id, prompt.turns[:1]), 10_000 + w, **kw)

    tried = list(prompts[:WARMUP_PROBES])
    recs = [r for rs in await asyncio.gather(*(one(tried[0], w) for w in range(n))) for r in rs]
    timed_out = bool(recs) and all((r.error or "").startswith("timeout") for r in recs)
    tried_n = 1
    for prompt in tried[1:]:
        if not recs or any(r.ok for r in recs) or timed_out:  # a server that hangs hangs on every prompt
            break
        recs += await one(prompt, n + tried_n)
        tried_n += 1
    if recs and not any(r.ok for r in recs):
        which = f"the first {tried_n} prompts" if tried_n > 1 else "the first prompt"
        raise UsageError(f"every warmup request failed, on {which} (first: {recs[0].error})",
                         hint=("the server accepted the request and never finished it: check its log and load, or raise "
                               "--timeout" if timed_out else "check --url, --model, --api-key and the server's log"))


async def drive(backend, prompts: Sequence[Prompt], *, max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                seed: int = 0, concurrency: int = 1, request_rate: float | None = None, warmup: int = 0,
                on_record: Callable[[RequestRecord], None] | None = None, progress: bool = True,
                desc: str = "requests", announce_warmup: bool = False) -> list[RequestRecord]:
    """Run every prompt (all turns) and return the records in completion order. `announce_warmup`: one stderr line
    before an HTTP server's warmup (`run`; a sweep's points stay quiet)."""
    from tqdm.auto import tqdm

    await backend.start()
    try:
        kw = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
        if warmup and prompts:
            url, timeout_s = getattr(backend, "url", None), getattr(backend, "timeout_s", None)
            if announce_warmup and url:  # a hanging server would otherwise leave the terminal silent for --timeout
                print(f"warmup: {warmup} short request{'s' if warmup != 1 else ''} to {url}"
                      + (f" (each may take up to --timeout {timeout_s:g} s)" if timeout_s else ""), file=sys.stderr)
            await _warmup(backend, prompts, warmup, min(warmup, concurrency if request_rate is None else warmup), **kw)

        total = sum(len(p.turns) for p in prompts)
        bar = tqdm(total=total, desc=desc, unit="req", disable=not progress, leave=False)
        results: list[RequestRecord] = []
        errors = 0

        def done(recs: list[RequestRecord]) -> None:
            nonlocal errors
            for r in recs:
                results.append(r)
                errors += 0 if r.ok else 1
                if on_record is not None:
                    on_record(r)
            bar.update(len(recs))
            if errors:
                bar.set_postfix(errors=errors, refresh=False)

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
    finally:
        await backend.aclose()
