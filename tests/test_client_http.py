"""The HTTP backend against small fake servers: what it sends, what it parses, and how every kind of
failure becomes a per-request error (or exit 2 before the first request)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from ddtree_bench.backends.client import HTTPBackend
from ddtree_bench.config import RunSpec
from ddtree_bench.load import drive
from ddtree_bench.records import Prompt
from http_support import ThreadedServer, sse, write_suite


SEEN = web.AppKey("seen", list)


def fake_app(handler, model="m", served=None):
    """/v1/models serving `model` (or the ids `served`), and `handler` on both generation endpoints;
    requests seen in app[SEEN]."""
    app = web.Application()
    app[SEEN] = []

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": m, "object": "model"} for m in (served or [model])]})

    async def gen(request):
        body = await request.json()
        app[SEEN].append((request.path, dict(request.headers), body))
        return await handler(request, body, len(app[SEEN]) - 1)

    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", gen)
    app.router.add_post("/v1/completions", gen)
    return app


async def stream(request, events, done=True, cut=False):
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for e in events:
        await resp.write(sse(e))
        await asyncio.sleep(0.002)
    if cut:  # the server process "dies": the connection drops mid-stream
        request.transport.close()
        return resp
    if done:
        await resp.write(b"data: [DONE]\n\n")
    return resp


def content(ids, text, finish=None, chat=True):
    ch = {"index": 0, "token_ids": ids, "finish_reason": finish}
    if chat:
        ch["delta"] = {"content": text}
    else:
        ch["text"] = text
    return {"choices": [ch]}


def backend(url, kind="vllm", **kw):
    kw.setdefault("model", "m")
    return HTTPBackend(kind, url, **kw)


def drive_sync(b, prompts, **kw):
    kw.setdefault("max_new_tokens", 8)
    kw.setdefault("progress", False)
    return asyncio.run(drive(b, prompts, **kw))


# ---------------------------------------------------------------------------- what is sent and parsed


def test_vllm_stream_request_body_timestamps_and_histogram_stats():
    async def handler(request, body, i):
        return await stream(request, [
            {"prompt_token_ids": [1, 2, 3], **content([7], "a")},
            content([8, 9, 10], "bcd"),
            content([11], "e", "length"),
            {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
             "metrics": {"speculative_decoding": {"num_spec_steps": 2, "acceptance_histogram": [1, 0, 0, 1], "num_spec_tokens": 3}}},
        ])

    app = fake_app(handler)
    with ThreadedServer(app) as s:
        b = backend(s.url + "/v1/", api_key="k1", timeout_s=30)
        recs = drive_sync(b, [Prompt("p", ["hello"])], max_new_tokens=5, seed=9)
    (rec,) = recs
    path, headers, body = app[SEEN][0]
    assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer k1"
    assert body["temperature"] == 0.0 and body["top_p"] == 1.0 and body["max_tokens"] == 5 and body["seed"] == 9
    assert body["stream"] is True and body["stream_options"]["include_usage"] is True and body["return_token_ids"] is True
    assert body["messages"] == [{"role": "user", "content": "hello"}] and body["model"] == "m"
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert "return_spec_tokens_details" not in body  # SGLang-only field
    assert rec.ok and rec.output_ids == [7, 8, 9, 10, 11] and rec.output_text == "abcde" and rec.prompt_ids == [1, 2, 3]
    assert rec.chunk_tokens == [1, 3, 1] and rec.num_output_tokens == 5 and rec.num_prompt_tokens == 3
    assert rec.t_send_ns < rec.t_first_token_ns == rec.chunk_times_ns[0] <= rec.chunk_times_ns[-1] <= rec.t_done_ns
    assert sorted(rec.accept_lengths) == [1, 4] and rec.accept_lengths_source == "histogram"
    assert rec.server_stats["source"] == "vllm" and b.block_size == 16


def test_sglang_gets_its_spec_field_and_sglext_is_parsed():
    async def handler(request, body, i):
        return await stream(request, [
            content([5, 6], "xy"), content([7], "z", "stop"),
            {"choices": [], "sglext": {"spec_tokens_details": {"spec_verify_ct": 2, "spec_correct_drafts_histogram": [1, 1]}}},
            {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}},
        ])

    app = fake_app(handler)
    with ThreadedServer(app) as s:
        (rec,) = drive_sync(backend(s.url, "sglang"), [Prompt("p", ["q"])])
    assert app[SEEN][0][2]["return_spec_tokens_details"] is True
    assert rec.ok and sorted(rec.accept_lengths) == [1, 2] and rec.server_stats["source"] == "sglang-sglext"


def test_completions_endpoint_sends_client_rendered_token_ids():
    async def handler(request, body, i):
        return await stream(request, [content([104], "h", "length", chat=False)])

    app = fake_app(handler, model="random")
    with ThreadedServer(app) as s:
        (rec,) = drive_sync(HTTPBackend("standalone", s.url, model="random", endpoint="completions"), [Prompt("p", ["hi"])])
    path, _, body = app[SEEN][0]
    assert path == "/v1/completions" and "messages" not in body
    assert body["prompt"][0] == 257 and body["prompt"][-2:] == [ord("t"), ord("\n")]  # ChatML ... assistant\n
    assert rec.prompt_ids == body["prompt"]  # the server sent none back: the ids we rendered


def test_token_count_mismatch_between_usage_and_ids_is_flagged():
    async def handler(request, body, i):
        return await stream(request, [content([1, 2], "ab", "stop"), {"choices": [], "usage": {"completion_tokens": 3}}])

    with ThreadedServer(fake_app(handler)) as s:
        (rec,) = drive_sync(backend(s.url), [Prompt("p", ["q"])])
    assert rec.ok and rec.num_output_tokens == 3
    assert rec.server_stats["token_count_mismatch"] == {"usage_completion_tokens": 3, "token_ids": 2}


# ---------------------------------------------------------------------------- failures


def test_each_failure_kind_becomes_a_per_request_error():
    async def handler(request, body, i):
        pid = body["messages"][0]["content"]
        if pid == "http400":
            return web.json_response({"error": {"message": "max_tokens is too large", "code": 400}}, status=400)
        if pid == "http503":
            return web.Response(status=503, text="overloaded")
        if pid == "truncated":  # a clean end of stream, but no [DONE]
            return await stream(request, [content([1], "a")], done=False)
        if pid == "cut":
            return await stream(request, [content([1], "a"), content([2], "b")], cut=True)
        if pid == "error-event":
            return await stream(request, [content([1], "a"), {"error": {"message": "CUDA out of memory", "code": 500}}])
        if pid == "garbage":
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b"data: {not json\n\n")
            return resp
        if pid == "slow":
            await asyncio.sleep(3)
        return await stream(request, [content([1, 2], "ok", "stop")])

    kinds = ["http400", "http503", "truncated", "cut", "error-event", "garbage", "slow", "fine"]
    with ThreadedServer(fake_app(handler)) as s:
        recs = {r.prompt_id: r for r in drive_sync(backend(s.url, timeout_s=1.0), [Prompt(k, [k]) for k in kinds], concurrency=4)}
    assert recs["http400"].error == "http 400: max_tokens is too large"
    assert recs["http503"].error == "http 503: overloaded"
    assert recs["truncated"].error.startswith("truncated stream: the response ended without [DONE] after 1 tokens")
    assert recs["cut"].error.startswith("truncated stream")
    assert recs["error-event"].error == "server error: CUDA out of memory"
    assert recs["garbage"].error.startswith("bad response")
    assert recs["slow"].error == "timeout: no complete response within 1s"
    assert recs["fine"].ok and recs["fine"].output_ids == [1, 2]
    assert all(r.t_send_ns is not None and r.t_done_ns >= r.t_send_ns for r in recs.values())


def test_connection_refused_mid_run_errors_the_rest_and_the_run_finishes():
    async def handler(request, body, i):
        return await stream(request, [content([1], "a", "stop")])

    server = ThreadedServer(fake_app(handler))
    with server:
        b = backend(server.url)
        seen = []

        def on_record(r):
            seen.append(r)
            if len(seen) == 2:
                server.stop()  # the server goes away after two answers

        recs = drive_sync(b, [Prompt(f"p{i}", ["q"]) for i in range(5)], on_record=on_record, warmup=0)
    assert len(recs) == 5 and sum(r.ok for r in recs) == 2
    assert all(r.error.startswith(("connection:", "truncated stream")) for r in recs if not r.ok)


def test_run_against_a_server_that_cuts_some_streams_writes_records_and_summary(tmp_path):
    """End to end through runner.execute: per-request errors, a finished run, summary.json written."""
    from ddtree_bench.results import read_json, read_records
    from ddtree_bench.runner import execute

    async def handler(request, body, i):
        cut = body["messages"][-1]["content"].startswith("cut")
        return await stream(request, [content([1, 2], "ab"), content([3], "c", "length"),
                                      {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3}}], cut=cut)

    suite = write_suite(tmp_path / "s.jsonl", [("a", ["hello"]), ("b", ["cut me"]), ("c", ["hi", "again"]), ("d", ["cut too"])])
    with ThreadedServer(fake_app(handler)) as s:
        spec = RunSpec(backend="vllm", url=s.url, model="m", suite=str(suite), max_new_tokens=3, concurrency=2)
        result = execute(spec, tmp_path / "run", progress=False)
    recs = {(r.prompt_id, r.turn): r for r in read_records(tmp_path / "run")}
    assert set(recs) == {("a", 0), ("b", 0), ("c", 0), ("c", 1), ("d", 0)}
    assert recs[("b", 0)].error.startswith("truncated stream") and recs[("d", 0)].error.startswith("truncated stream")
    assert recs[("c", 1)].ok and recs[("c", 1)].output_ids == [1, 2, 3]
    summary = read_json(tmp_path / "run" / "summary.json")
    assert summary["num_requests"] == 5 and summary["num_errors"] == 2 and summary["error_kinds"] == {"truncated stream": 2}
    assert result.summary["output_throughput_tok_s"] > 0
    run = read_json(tmp_path / "run" / "run.json")
    assert run["backend"]["served_model"] == "m" and run["backend"]["connections_opened"] <= 4


def test_unreachable_server_is_exit_2_with_the_url_and_nothing_written(tmp_path, capsys):
    import socket

    from ddtree_bench.cli import main

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        main(["run", "--backend", "standalone", "--url", f"http://127.0.0.1:{port}", "--suite", "smoke",
              "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"cannot reach the server at http://127.0.0.1:{port}" in err
    assert not out.exists() and not any(tmp_path.iterdir())


def test_wrong_api_key_and_unknown_model_are_usage_errors():
    from ddtree_bench.errors import UsageError

    async def handler(request, body, i):
        return await stream(request, [content([1], "a", "stop")])

    async def models_401(request):
        return web.json_response({"error": {"message": "Unauthorized"}}, status=401)

    app = web.Application()
    app.router.add_get("/v1/models", models_401)
    with ThreadedServer(app) as s:
        with pytest.raises(UsageError, match="rejected the API key"):
            drive_sync(backend(s.url), [Prompt("p", ["q"])])
    with ThreadedServer(fake_app(handler, served=["x", "y"])) as s:
        with pytest.raises(UsageError, match="serves x, y, not 'm'"):
            drive_sync(backend(s.url), [Prompt("p", ["q"])])
