"""`ddtree-bench serve` as a real subprocess, driven by the HTTP backend: exactly the in-process
outputs and acceptance lengths (greedy, DDTree and DFlash, concurrency 8, zero errors), the full
`runner.execute` path, a server killed mid-stream, SIGTERM shutdown, and clients that disconnect
(streaming or not) freeing the engine."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import aiohttp
import pytest
import requests

from ddtree_bench.backends.client import HTTPBackend
from ddtree_bench.backends.inprocess import InProcessBackend
from ddtree_bench.backends.server_metrics import parse_prometheus
from ddtree_bench.driver import drive
from ddtree_bench.records import Prompt
from http_support import ServeProcess, write_suite

pytestmark = pytest.mark.slow

BUDGET = 32
MAX_NEW = 16
PROMPTS = [
    Prompt("short", ["Hi."]),
    Prompt("math", ["What is 12 + 30? Answer briefly."]),
    Prompt("code", ["Write a Python function that returns the square of a number."]),
    Prompt("unicode", ["Translate: 日本語のテキスト — and emoji 🚀?"]),
    Prompt("list", ["Name three colours."]),
    Prompt("story", ["Tell me a story about a tree that grows tokens."]),
    Prompt("multi", ["Name three colours.", "Now name three more."]),
    Prompt("long", ["Summarise: " + "the quick brown fox jumps over the lazy dog. " * 8]),
    Prompt("stop-early", ["Say nothing."], max_new_tokens=5),
    Prompt("json", ['Return {"a": 1} as JSON.']),
]


@pytest.fixture(scope="module")
def servers():
    """Four random-model servers, started together (their imports overlap)."""
    procs = {
        "ddtree": ServeProcess("--model", "random", "--method", "ddtree", "--budget", str(BUDGET)),
        "dflash": ServeProcess("--model", "random", "--method", "dflash"),
        "victim-kill": ServeProcess("--model", "random", "--method", "ddtree", "--budget", "16"),
        "victim-term": ServeProcess("--model", "random", "--method", "dflash", "--shutdown-grace", "0.3"),
    }
    try:
        for p in procs.values():
            p.wait_ready()
        yield procs
    finally:
        codes = {name: p.terminate() for name, p in procs.items() if p.proc.poll() is None}
        for p in procs.values():
            p.kill()
    assert all(c == 0 for c in codes.values()), codes  # SIGTERM on an idle server: exit 0


@pytest.fixture(scope="module")
def reference():
    """In-process records of PROMPTS for each method (the same seeded random pair as the servers)."""
    import torch

    from ddtree_bench.pair import load_pair

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the servers run beside us on 2 shared cores
    try:
        pair = load_pair("random", None, "ddtree")
        out = {}
        for method in ("ddtree", "dflash"):
            b = InProcessBackend(pair, method, BUDGET)
            recs = asyncio.run(drive(b, PROMPTS, max_new_tokens=MAX_NEW, concurrency=1, progress=False))
            out[method] = {(r.prompt_id, r.turn): r for r in recs}
        return out
    finally:
        torch.set_num_threads(threads)


def http_run(url, prompts, **kw):
    b = HTTPBackend("standalone", url, model="random", endpoint=kw.pop("endpoint", "chat"), timeout_s=300)
    kw.setdefault("max_new_tokens", MAX_NEW)
    kw.setdefault("progress", False)
    return asyncio.run(drive(b, prompts, **kw)), b


def assert_same(http_recs, ref):
    assert len(http_recs) == len(ref)
    for r in http_recs:
        want = ref[(r.prompt_id, r.turn)]
        assert r.error is None, (r.prompt_id, r.error)
        assert r.output_ids == want.output_ids, r.prompt_id
        assert r.accept_lengths == want.accept_lengths and r.accept_lengths_source == "rounds", r.prompt_id
        assert r.prompt_ids == want.prompt_ids and r.output_text == want.output_text
        assert r.finish_reason == want.finish_reason and r.num_output_tokens == len(want.output_ids)
        assert r.chunk_tokens == want.chunk_tokens  # one SSE chunk per verify round


@pytest.mark.parametrize("method", ["ddtree", "dflash"])
def test_http_outputs_and_acceptance_equal_in_process_at_concurrency_8(servers, reference, method):
    recs, b = http_run(servers[method].url, PROMPTS, concurrency=8, warmup=1)
    assert_same(recs, reference[method])
    assert b.connections_opened <= 8 + 1  # one keep-alive pool, not a connection per request
    info = b.describe()["server_info"]
    assert info["method"] == method and info["model"] == "random"


def test_sampled_outputs_follow_the_per_request_seed(servers):
    """T > 0: the seed the driver derives per request reaches the server's sampler (same tokens as in-process)."""
    import torch

    from ddtree_bench.pair import load_pair

    kw = dict(max_new_tokens=12, temperature=0.9, top_p=0.95, seed=11, progress=False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ref = asyncio.run(drive(InProcessBackend(load_pair("random", None, "ddtree"), "dflash", BUDGET), PROMPTS[:3], **kw))
    finally:
        torch.set_num_threads(threads)
    recs, _ = http_run(servers["dflash"].url, PROMPTS[:3], concurrency=3, **kw)
    want = {(r.prompt_id, r.turn): r for r in ref}
    for r in recs:
        assert r.ok and r.output_ids == want[(r.prompt_id, r.turn)].output_ids
        assert r.accept_lengths == want[(r.prompt_id, r.turn)].accept_lengths


def test_completions_endpoint_with_client_rendered_ids_equals_in_process(servers, reference):
    recs, _ = http_run(servers["ddtree"].url, PROMPTS[:4], endpoint="completions", concurrency=2)
    assert_same(recs, {k: v for k, v in reference["ddtree"].items() if k[0] in {p.prompt_id for p in PROMPTS[:4]}})


def test_run_command_end_to_end_through_runner_and_server_counters(servers, reference, tmp_path):
    from ddtree_bench import metrics
    from ddtree_bench.run_spec import RunSpec
    from ddtree_bench.results import read_json, read_records
    from ddtree_bench.runner import execute

    url = servers["ddtree"].url
    suite = write_suite(tmp_path / "s.jsonl", [(p.prompt_id, p.turns) for p in PROMPTS if p.max_new_tokens is None])
    before = parse_prometheus(requests.get(url + "/metrics", timeout=30).text)
    spec = RunSpec(backend="standalone", url=url, model="random", suite=str(suite), max_new_tokens=MAX_NEW,
                   concurrency=8, warmup=0)
    execute(spec, tmp_path / "run", progress=False)
    after = parse_prometheus(requests.get(url + "/metrics", timeout=30).text)
    recs = read_records(tmp_path / "run")
    ref = reference["ddtree"]
    assert_same(recs, {k: v for k, v in ref.items() if k[0] != "stop-early"})
    summary = read_json(tmp_path / "run" / "summary.json")
    want = metrics.summarize([ref[(r.prompt_id, r.turn)] for r in recs], block_size=16)
    for key in ("num_errors", "acceptance_length_mean", "acceptance_length_token_weighted", "acceptance_histogram",
                "acceptance_rate_by_depth", "total_output_tokens"):
        assert summary[key] == want[key], key
    # the server's Prometheus counters agree with the client-side rounds: 1 + accepted/drafts
    lab = '{model_name="random"}'
    drafts = after[f"ddtree:spec_decode_num_drafts_total{lab}"] - before[f"ddtree:spec_decode_num_drafts_total{lab}"]
    accepted = after[f"ddtree:spec_decode_num_accepted_tokens_total{lab}"] - before[f"ddtree:spec_decode_num_accepted_tokens_total{lab}"]
    assert 1 + accepted / drafts == pytest.approx(summary["acceptance_length_token_weighted"])
    run = read_json(tmp_path / "run" / "run.json")
    assert run["backend"]["server_info"]["budget"] == BUDGET and run["backend"]["server_version"]


def test_server_killed_mid_stream_gives_per_request_errors_and_a_finished_run(servers):
    victim = servers["victim-kill"]
    prompts = [Prompt(f"ok{i}", ["Hi."], max_new_tokens=4) for i in range(3)]
    prompts += [Prompt(f"long{i}", ["Tell me everything."], max_new_tokens=1500) for i in range(3)]
    seen = []

    def watch_and_kill():  # once the first long request has streamed its first token, SIGKILL the server
        deadline = time.time() + 120
        while time.time() < deadline:
            m = parse_prometheus(requests.get(victim.url + "/metrics", timeout=30).text)
            if m.get('ddtree:time_to_first_token_seconds_count{model_name="random"}', 0) >= 4:
                break
            time.sleep(0.02)
        victim.kill()

    def on_record(r):
        seen.append(r)
        if len(seen) == 3:
            threading.Thread(target=watch_and_kill, daemon=True).start()

    recs, _ = http_run(victim.url, prompts, concurrency=1, warmup=0, on_record=on_record)
    by = {r.prompt_id: r for r in recs}
    assert len(recs) == 6 and all(by[f"ok{i}"].ok for i in range(3))
    assert by["long0"].error.startswith("truncated stream: the connection broke after"), by["long0"].error
    assert int(by["long0"].error.split("after ")[1].split(" ")[0]) >= 1  # it died mid-stream
    assert all(by[f"long{i}"].error.startswith("connection:") for i in (1, 2)), [by[f"long{i}"].error for i in (1, 2)]


def test_sigterm_past_the_grace_period_cuts_the_stream_and_exits_0(servers):
    victim = servers["victim-term"]

    async def stream_then_terminate():
        async with aiohttp.ClientSession() as s:
            body = {"prompt": "x", "max_tokens": 3000, "temperature": 0, "stream": True}
            async with s.post(victim.url + "/v1/completions", json=body) as resp:
                chunks, t_term = 0, None
                try:
                    async for line in resp.content:
                        if line.startswith(b"data:"):
                            chunks += 1
                            if chunks == 2:
                                victim.proc.send_signal(signal.SIGTERM)
                                t_term = time.time()
                            assert b"[DONE]" not in line
                except aiohttp.ClientPayloadError:
                    pass
                return chunks, t_term

    chunks, t_term = asyncio.run(stream_then_terminate())
    assert chunks >= 2
    assert victim.proc.wait(timeout=60) == 0
    assert time.time() - t_term < 30  # the engine thread stopped at its next round, not after 3000 tokens


def test_sigterm_lets_an_in_flight_request_finish_and_refuses_new_ones():
    p = ServeProcess("--null", "--null-delay-ms", "20", "--shutdown-grace", "30").wait_ready()
    try:
        async def run():
            async with aiohttp.ClientSession() as s:
                body = {"prompt": "x", "max_tokens": 80, "stream": True, "return_token_ids": True}
                async with s.post(p.url + "/v1/completions", json=body) as resp:
                    lines = []
                    async for line in resp.content:
                        if line.startswith(b"data:"):
                            lines.append(line)
                            if len(lines) == 2:
                                p.proc.send_signal(signal.SIGTERM)
                                await asyncio.sleep(0.2)
                                try:
                                    async with aiohttp.ClientSession() as s2:
                                        async with s2.get(p.url + "/health") as h:
                                            refused = h.status == 503
                                except aiohttp.ClientConnectionError:
                                    refused = True
                                assert refused
                    return lines

        lines = asyncio.run(run())
        assert lines[-1].strip() == b"data: [DONE]"
        assert p.proc.wait(timeout=60) == 0
    finally:
        p.kill()


def test_a_client_that_disconnects_frees_the_engine(servers):
    """A vanished client's generation stops at its next round: the next request is not stuck behind it."""
    url = servers["dflash"].url

    async def go():
        async with aiohttp.ClientSession() as s:
            body = {"prompt": "x", "max_tokens": 3000, "temperature": 0, "stream": True}
            async with s.post(url + "/v1/completions", json=body) as resp:
                n = 0
                async for line in resp.content:
                    n += line.startswith(b"data:")
                    if n == 2:
                        break  # leaving the block closes the connection mid-stream
        t = time.time()
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/completions", json={"prompt": "y", "max_tokens": 2, "temperature": 0}) as r:
                assert r.status == 200 and (await r.json())["usage"]["completion_tokens"] == 2
        return time.time() - t

    before = parse_prometheus(requests.get(url + "/metrics", timeout=30).text)
    assert asyncio.run(go()) < 10  # 3000 tokens take tens of seconds on this CPU
    after = parse_prometheus(requests.get(url + "/metrics", timeout=30).text)
    key = 'ddtree:request_success_total{model_name="random",finished_reason="abort"}'
    assert after.get(key, 0) - before.get(key, 0) == 1


def test_a_non_streaming_client_that_disconnects_frees_the_engine(servers):
    """Non-streaming too (issue 17: an abandoned 3000-token request delayed the next one by a minute)."""
    import json
    import socket

    url = servers["dflash"].url
    lab = '{model_name="random"}'
    before = parse_prometheus(requests.get(url + "/metrics", timeout=30).text)
    host, port = url.split("//")[1].split(":")
    body = json.dumps({"prompt": "x", "max_tokens": 3000, "temperature": 0, "ignore_eos": True}).encode()
    sock = socket.create_connection((host, int(port)), timeout=60)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    deadline = time.time() + 120
    while True:  # the engine has committed its first round
        m = parse_prometheus(requests.get(url + "/metrics", timeout=30).text)
        if m[f"ddtree:time_to_first_token_seconds_count{lab}"] > before[f"ddtree:time_to_first_token_seconds_count{lab}"]:
            break
        assert time.time() < deadline
        time.sleep(0.02)
    sock.close()
    t = time.time()
    r = requests.post(url + "/v1/completions", json={"prompt": "y", "max_tokens": 2, "temperature": 0}, timeout=300)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
    assert time.time() - t < 10  # 3000 tokens take tens of seconds on this CPU
    after = parse_prometheus(requests.get(url + "/metrics", timeout=30).text)
    key = 'ddtree:request_success_total{model_name="random",finished_reason="abort"}'
    assert after.get(key, 0) - before.get(key, 0) == 1
    assert after[f"ddtree:generation_tokens_total{lab}"] - before[f"ddtree:generation_tokens_total{lab}"] == 2
