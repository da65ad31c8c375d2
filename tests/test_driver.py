"""The request driver (driver.py) against in-memory fake backends: load shapes, schedules, warmup, failures."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from ddtree_bench.errors import UsageError
from ddtree_bench.driver import drive, poisson_schedule
from ddtree_bench.records import GenerationRequest, Prompt, RequestRecord


class FakeBackend:
    """Answers after `delay_s` (optionally one request at a time); records every call."""

    kind = "fake"
    block_size = 16

    def __init__(self, delay_s: float = 0.0, serial: bool = False, fail=lambda req: None, raise_on=lambda req: False):
        self.delay_s, self.serial, self.fail, self.raise_on = delay_s, serial, fail, raise_on
        self.calls: list[GenerationRequest] = []
        self.dispatch_ns: list[int] = []
        self.in_flight = self.max_in_flight = 0
        self.started = self.closed = 0
        self._lock = None

    async def start(self):
        self.started += 1
        self._lock = asyncio.Lock()

    async def aclose(self):
        self.closed += 1

    def describe(self):
        return {"kind": self.kind}

    async def generate(self, req: GenerationRequest) -> RequestRecord:
        rec = RequestRecord(prompt_id=req.prompt_id, turn=req.turn, t_send_ns=time.perf_counter_ns())
        self.calls.append(req)
        self.dispatch_ns.append(rec.t_send_ns)
        if self.raise_on(req):
            raise RuntimeError("backend bug")
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.serial:
                async with self._lock:
                    await asyncio.sleep(self.delay_s)
            else:
                await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        rec.t_first_token_ns = rec.t_done_ns = time.perf_counter_ns()
        rec.error = self.fail(req)
        rec.output_text = f"answer to {req.prompt_id}/{req.turn}"
        rec.output_ids, rec.num_output_tokens, rec.chunk_times_ns, rec.chunk_tokens = [1], 1, [rec.t_done_ns], [1]
        return rec


def prompts(n: int, turns: int = 1) -> list[Prompt]:
    return [Prompt(f"p{i}", [f"q{i}.{t}" for t in range(turns)]) for i in range(n)]


def run(backend, ps, **kw):
    kw.setdefault("max_new_tokens", 8)
    kw.setdefault("progress", False)
    return asyncio.run(drive(backend, ps, **kw))


# ---------------------------------------------------------------------------- Poisson schedule


def test_poisson_schedule_statistics():
    rate, n = 50.0, 20000
    offsets = poisson_schedule(n, rate, seed=3)
    assert offsets[0] == 0.0 and all(b >= a for a, b in zip(offsets, offsets[1:]))
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    mean = sum(gaps) / len(gaps)
    std = math.sqrt(sum((g - mean) ** 2 for g in gaps) / (len(gaps) - 1))
    assert mean == pytest.approx(1 / rate, rel=0.03)   # 3 sigma of the mean is ~2.1%
    assert std / mean == pytest.approx(1.0, abs=0.04)  # exponential: coefficient of variation 1
    # Kolmogorov-Smirnov against Exp(rate): D < 1.63/sqrt(n) is the 1% critical value
    s = sorted(gaps)
    d = max(max(abs((i + 1) / len(s) - (1 - math.exp(-rate * g))), abs(i / len(s) - (1 - math.exp(-rate * g))))
            for i, g in enumerate(s))
    assert d < 1.63 / math.sqrt(len(s))


def test_poisson_schedule_is_seeded():
    assert poisson_schedule(100, 5.0, 1) == poisson_schedule(100, 5.0, 1)
    assert poisson_schedule(100, 5.0, 1) != poisson_schedule(100, 5.0, 2)
    with pytest.raises(ValueError):
        poisson_schedule(3, 0.0, 0)


def test_open_loop_sends_on_the_absolute_schedule_despite_slow_responses():
    """Responses take 10x the mean gap; arrivals must not wait for them (no coordinated omission)."""
    rate, n = 100.0, 40
    b = FakeBackend(delay_s=0.1)
    recs = run(b, prompts(n), request_rate=rate, seed=7)
    offsets = poisson_schedule(n, rate, seed=7)
    assert b.max_in_flight > 5
    by_id = {r.prompt_id: r for r in recs}
    t0 = min(r.t_send_ns for r in recs)
    lateness_ms = [(by_id[f"p{i}"].t_dispatch_ns - t0) / 1e6 - offsets[i] * 1e3 for i in range(n)]
    assert max(lateness_ms) < 50, lateness_ms  # event-loop lag only (generous: 2 shared cores)
    # t_send_ns is the scheduled arrival (or the actual send if that came a hair earlier)
    for i in range(n):
        assert (by_id[f"p{i}"].t_send_ns - t0) / 1e6 == pytest.approx(offsets[i] * 1e3, abs=5)
    achieved = (n - 1) / ((max(b.dispatch_ns) - min(b.dispatch_ns)) / 1e9)
    assert achieved == pytest.approx((n - 1) / offsets[-1], rel=0.1)


def test_open_loop_counts_queueing_behind_an_overloaded_server_as_latency():
    """A serial 30 ms server offered 100 req/s builds a backlog; latency is measured from the scheduled arrival."""
    b = FakeBackend(delay_s=0.03, serial=True)
    recs = run(b, prompts(30), request_rate=100.0, seed=1)
    e2e_ms = sorted((r.t_done_ns - r.t_send_ns) / 1e6 for r in recs)
    assert e2e_ms[0] >= 29
    assert e2e_ms[-1] > 300  # ~30 arrivals in ~0.3 s need ~0.9 s of service


# ---------------------------------------------------------------------------- closed loop, warmup, failures


@pytest.mark.parametrize("concurrency", [1, 4])
def test_closed_loop_keeps_exactly_c_requests_in_flight(concurrency):
    b = FakeBackend(delay_s=0.01)
    recs = run(b, prompts(12), concurrency=concurrency)
    assert len(recs) == 12 and all(r.ok for r in recs)
    assert b.max_in_flight == concurrency
    assert sorted(r.prompt_id for r in recs) == sorted(f"p{i}" for i in range(12))


def test_warmup_requests_are_sent_but_not_recorded_and_start_close_bracket_the_run():
    b = FakeBackend()
    seen = []
    recs = run(b, prompts(3), warmup=2, on_record=seen.append, max_new_tokens=100)
    assert len(b.calls) == 5 and len(recs) == 3 and len(seen) == 3
    warm = b.calls[:2]
    assert all(c.prompt_id == "p0" and c.turn == 0 and c.max_new_tokens == 16 for c in warm)  # short warmups
    assert b.started == 1 and b.closed == 1


def test_greedy_params_and_per_request_seeds_reach_the_backend():
    b = FakeBackend()
    run(b, prompts(3, turns=2), temperature=0.0, top_p=1.0, seed=5, max_new_tokens=33)
    assert all(c.temperature == 0.0 and c.top_p == 1.0 and c.max_new_tokens == 33 for c in b.calls)
    assert len({c.seed for c in b.calls}) == 6


def test_multi_turn_carries_the_models_own_answers():
    b = FakeBackend()
    recs = run(b, prompts(2, turns=3), concurrency=2)
    assert len(recs) == 6
    last = [c for c in b.calls if c.prompt_id == "p1" and c.turn == 2][0]
    assert [m["role"] for m in last.messages] == ["user", "assistant", "user", "assistant", "user"]
    assert last.messages[1]["content"] == "answer to p1/0" and last.messages[3]["content"] == "answer to p1/1"


def test_failed_turn_skips_the_rest_of_its_conversation_only():
    b = FakeBackend(fail=lambda req: "http 500: boom" if req.prompt_id == "p0" and req.turn == 0 else None)
    recs = {(r.prompt_id, r.turn): r for r in run(b, prompts(2, turns=2))}
    assert recs[("p0", 0)].error == "http 500: boom"
    assert recs[("p0", 1)].error.startswith("skipped")
    assert recs[("p1", 0)].ok and recs[("p1", 1)].ok


def test_a_backend_exception_becomes_an_error_record_not_a_crash():
    b = FakeBackend(raise_on=lambda req: req.prompt_id == "p1")
    recs = {r.prompt_id: r for r in run(b, prompts(3), concurrency=2)}
    assert recs["p1"].error.startswith("client: RuntimeError: backend bug")
    assert recs["p0"].ok and recs["p2"].ok
    assert b.closed == 1


def test_every_warmup_failing_is_a_usage_error_before_anything_is_measured():
    b = FakeBackend(fail=lambda req: "http 404: the model 'x' does not exist")
    seen = []
    with pytest.raises(UsageError, match="warmup.*does not exist"):
        run(b, prompts(3), warmup=2, on_record=seen.append)
    assert seen == [] and b.closed == 1
    # without warmup the same failures are per-request errors of a finished run
    recs = run(FakeBackend(fail=lambda req: "http 404: nope"), prompts(3), warmup=0)
    assert [r.error for r in recs] == ["http 404: nope"] * 3


def test_a_warmup_that_times_out_is_not_tried_on_more_prompts_and_names_timeout():
    """A server that accepts requests and never finishes them hangs on every prompt: one round of --timeout, not three,
    and the hint names --timeout."""
    b = FakeBackend(fail=lambda req: "timeout: no complete response within 5s")
    with pytest.raises(UsageError, match="on the first prompt") as e:
        run(b, prompts(3), warmup=1)
    assert len(b.calls) == 1 and "--timeout" in e.value.hint


def test_a_bad_first_prompt_is_its_own_error_not_a_failed_warmup():
    """The warmup runs on the first prompt; when only that prompt fails (e.g. over the context: a 400), the
    next prompt's warmup succeeds, the run goes on and the bad prompt is that request's error."""
    too_long = "http 400: prompt (25019 tokens) + max_tokens (4) exceeds the model's context of 4096 tokens"
    b = FakeBackend(fail=lambda req: too_long if req.prompt_id == "p0" else None)
    recs = {r.prompt_id: r for r in run(b, prompts(3), warmup=2)}
    assert recs["p0"].error == too_long and recs["p1"].ok and recs["p2"].ok
    with pytest.raises(UsageError, match="on the first 3 prompts"):   # every prompt failing is still a bad deployment
        run(FakeBackend(fail=lambda req: "http 404: nope"), prompts(5), warmup=1)


def test_run_announces_an_http_servers_warmup_and_a_sweep_point_does_not(capsys):
    """A server that hangs leaves the terminal silent for --timeout: `run` says what it is waiting for first."""
    b = FakeBackend()
    b.url, b.timeout_s = "http://127.0.0.1:9", 30.0
    run(b, prompts(1), warmup=2, announce_warmup=True)
    assert "warmup: 2 short requests to http://127.0.0.1:9 (each may take up to --timeout 30 s)" in capsys.readouterr().err
    run(b, prompts(1), warmup=2)
    assert capsys.readouterr().err == ""
