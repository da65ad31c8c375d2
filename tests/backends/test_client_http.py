"""The HTTP backend against small fake servers: what it sends, what it parses, and how every kind of
failure becomes a per-request error (or exit 2 before the first request)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from ddtree_bench.backends.client import HTTPBackend
from ddtree_bench.run_spec import RunSpec
from ddtree_bench.driver import drive
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
    assert recs["truncated"].error.startswith("truncated stream: the response ended without [DONE] or a finish_reason after 1 tokens")
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


# ---------------------------------------------------------------------------- issue 15: servers we do not know, SGLang chat, labels


# The top-level request fields of the OpenAI API (chat + legacy completions) that ddtree-bench may send
# to a server it does not know.
STANDARD_FIELDS = {"model", "messages", "prompt", "stream", "stream_options", "max_tokens", "temperature", "top_p", "seed"}


def strict_app(handler, model="m", done=False):
    """A server in the manner of `transformers serve`: 422 for any field outside the standard set
    (and for vendor keys inside stream_options), usage on the finish chunk, no [DONE] unless `done`."""
    async def strict(request, body, i):
        extra = set(body) - STANDARD_FIELDS
        if body.get("stream_options") and set(body["stream_options"]) - {"include_usage"}:
            extra |= {"stream_options." + k for k in set(body["stream_options"]) - {"include_usage"}}
        if extra:
            return web.json_response({"detail": f"Unexpected fields in the request: {sorted(extra)}"}, status=422)
        return await handler(request, body, i)

    return fake_app(strict, model=model)


def _text_chunks(pieces, finish="length", usage=None, chat=True):
    out = [{"choices": [{"index": 0, "delta": {"role": "assistant"}}]}] if chat else []
    for piece in pieces:
        out.append({"choices": [{"index": 0, **({"delta": {"content": piece}} if chat else {"text": piece})}]})
    last = {"index": 0, "finish_reason": finish, **({"delta": {}} if chat else {"text": ""})}
    out.append({"choices": [last], "usage": {"prompt_tokens": 5, "completion_tokens": usage, "total_tokens": 5 + usage}})
    return out


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_openai_backend_sends_standard_fields_only_and_retokenizes_text(endpoint):
    from ddtree_bench import metrics
    from ddtree_bench.backends.client import local_tokenizer

    tok = local_tokenizer("toy")
    answer = "The answer is 5, and then some more words."
    pieces = [answer[i:i + 3] for i in range(0, len(answer), 3)]  # 3 characters per chunk
    n_tokens = len(tok.encode(answer))

    async def handler(request, body, i):
        return await stream(request, _text_chunks(pieces, usage=n_tokens, chat=endpoint == "chat"), done=False)

    app = strict_app(handler)
    prompts = [Prompt(f"p{k}", ["What is 2+3?"]) for k in range(8)]
    with ThreadedServer(app) as s:
        recs = drive_sync(backend(s.url, "openai", model="toy", endpoint=endpoint, stop_ids=[258]), prompts,
                          max_new_tokens=64, warmup=0)
    for path, _, body in app[SEEN]:
        assert set(body) <= STANDARD_FIELDS, set(body) - STANDARD_FIELDS
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    body = app[SEEN][0][2]
    if endpoint == "completions":  # text, rendered by the local chat template (the standard prompt type)
        assert isinstance(body["prompt"], str) and body["prompt"].endswith("assistant\n")
    for rec in recs:
        assert rec.ok, rec.error  # finish_reason, no [DONE]: complete (as the official openai client reads it)
        assert rec.finish_reason == "length" and rec.output_text == answer
        assert rec.token_source == "retokenized" and rec.output_ids == tok.encode(answer)
        assert sum(rec.chunk_tokens) == n_tokens == rec.num_output_tokens  # not the text chunks + the usage again
        assert rec.server_stats["chunk_token_counts_from"] == "retokenized-text"
    itl = [x for r in recs for x in metrics.itl_samples_ms(r)]
    assert len(itl) == sum(r.num_output_tokens - r.chunk_tokens[0] for r in recs)  # one ITL sample per token after the first chunk


def test_openai_backend_nonstreaming_and_server_ids_win_over_retokenizing():
    async def handler(request, body, i):
        assert body["stream"] is False and "stream_options" not in body
        choice = {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        if i == 1:  # this server does send ids (vLLM's chat shape, asked nothing)
            choice["token_ids"] = [104, 105, 258]
        return web.json_response({"choices": [choice], "usage": {"prompt_tokens": 4, "completion_tokens": 3}})

    app = strict_app(handler)
    with ThreadedServer(app) as s:
        recs = drive_sync(backend(s.url, "openai", model="toy", stream=False), [Prompt("a", ["q"]), Prompt("b", ["q"])], warmup=0)
    a, b = sorted(recs, key=lambda r: r.prompt_id)
    assert a.ok and a.token_source == "retokenized" and a.output_ids == [104, 105] and a.chunk_tokens == [3]
    assert a.t_first_token_ns is None and a.chunk_times_ns == [a.t_done_ns]  # one body: no first-token time (TTFT/TPOT unknown)
    assert a.server_stats["token_count_mismatch"] == {"usage_completion_tokens": 3, "token_ids": 2}  # the stop token is not in the text
    assert b.ok and b.token_source == "server" and b.output_ids == [104, 105, 258]


def test_known_backends_are_refused_by_a_strict_server_but_openai_is_not():
    async def handler(request, body, i):
        return await stream(request, _text_chunks(["ok"], usage=2), done=False)

    with ThreadedServer(strict_app(handler, model="toy")) as s:
        (vllm,) = drive_sync(backend(s.url, "vllm", model="toy"), [Prompt("p", ["q"])], warmup=0)
        (generic,) = drive_sync(backend(s.url, "openai", model="toy"), [Prompt("p", ["q"])], warmup=0)
    assert vllm.error.startswith("http 422: Unexpected fields in the request") and "return_token_ids" in vllm.error
    assert generic.ok and generic.output_text == "ok"


def test_vendor_stream_with_finish_reason_but_no_done_is_complete_and_without_either_truncated():
    async def handler(request, body, i):
        finish = "stop" if body["messages"][0]["content"] == "finished" else None
        return await stream(request, [content([1, 2], "ab"), content([3], "c", finish)], done=False)

    with ThreadedServer(fake_app(handler)) as s:
        recs = {r.prompt_id: r for r in drive_sync(backend(s.url), [Prompt("finished", ["finished"]), Prompt("cut", ["cut"])], warmup=0)}
    assert recs["finished"].ok and recs["finished"].output_ids == [1, 2, 3] and recs["finished"].t_done_ns >= recs["finished"].chunk_times_ns[-1]
    assert recs["cut"].error.startswith("truncated stream: the response ended without [DONE] or a finish_reason after 3 tokens")


SGLANG_STREAM_IDS_400 = ("return_token_ids is not supported with streaming on /v1/chat/completions. "
                         "Please set stream=false when using return_token_ids=true.")


def sglang_app():
    """SGLang 0.5.23's chat/completions id rules (serving_chat.py, serving_completions.py), as payloads."""
    async def handler(request, body, i):
        chat = request.path.endswith("/chat/completions")
        if chat and body.get("stream") and body.get("return_token_ids"):
            return web.json_response({"object": "error", "message": SGLANG_STREAM_IDS_400, "type": "BadRequest", "code": 400},
                                     status=400)
        details = {"spec_verify_ct": 2, "spec_correct_drafts_histogram": [0, 1, 1]}
        if not body.get("stream"):
            choice = {"index": 0, "finish_reason": "length"}
            if chat:
                choice["message"] = {"role": "assistant", "content": "abc"}
                if body.get("return_token_ids"):
                    choice.update(response_token_ids=[97, 98, 99], prompt_token_ids=[1, 2])
            else:
                choice.update(text="abc", token_ids=[97, 98, 99] if body.get("return_token_ids") else None)
            return web.json_response({"choices": [choice], "usage": {"prompt_tokens": 2, "completion_tokens": 3},
                                      "sglext": {"spec_tokens_details": details}})
        if chat:
            events = [{"choices": [{"index": 0, "delta": {"content": "ab"}}], "usage": {"completion_tokens": 2}},
                      {"choices": [{"index": 0, "delta": {"content": "c"}, "finish_reason": "length"}], "usage": {"completion_tokens": 3}}]
            ext = {"spec_tokens_details": details}
            if body.get("return_output_ids_in_sglext"):
                ext["output_ids"] = [[97, 98, 99]]
            if body.get("return_input_ids_in_sglext"):
                ext["input_ids"] = [1, 2]
            events.append({"choices": [], "sglext": ext})
        else:
            events = [content([97, 98], "ab", chat=False), content([99], "c", "length", chat=False),
                      {"choices": [], "sglext": {"spec_tokens_details": details}}]
        events.append({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3}})
        return await stream(request, events)

    return fake_app(handler, model="random")


@pytest.mark.parametrize("endpoint,streamed", [("chat", True), ("chat", False), ("completions", True), ("completions", False)])
def test_sglang_runs_on_every_endpoint_and_mode_with_ids(endpoint, streamed):
    app = sglang_app()
    with ThreadedServer(app) as s:
        (rec,) = drive_sync(HTTPBackend("sglang", s.url, model="random", endpoint=endpoint, stream=streamed),
                            [Prompt("p", ["q"])], max_new_tokens=3, warmup=0)
    body = app[SEEN][0][2]
    assert rec.ok, rec.error
    assert rec.output_ids == [97, 98, 99] and rec.token_source == "server" and rec.output_text == "abc"
    assert sorted(rec.accept_lengths) == [2, 3] and body["return_spec_tokens_details"] is True
    if endpoint == "chat" and streamed:
        assert "return_token_ids" not in body and body["return_output_ids_in_sglext"] is True
        assert rec.prompt_ids == [1, 2] and rec.chunk_tokens == [2, 1]  # counts from the continuous usage
    else:
        assert body["return_token_ids"] is True and "return_output_ids_in_sglext" not in body


def info_app(info):
    app = fake_app(lambda request, body, i: stream(request, [content([1], "a", "stop")]), model="toy")

    async def server_info(request):
        return web.json_response(info)

    app.router.add_get("/server_info", server_info)
    return app


def test_standalone_run_without_budget_is_labelled_from_the_server(tmp_path, capsys):
    from ddtree_bench.cli import main
    from ddtree_bench.results import read_json

    with ThreadedServer(info_app({"server": "ddtree-bench serve", "method": "ddtree", "budget": 32, "block_size": 16})) as s:
        base = ["run", "--backend", "standalone", "--url", s.url, "--suite", "smoke", "--limit", "1", "--warmup", "0", "--quiet"]
        main(base + ["--out", str(tmp_path / "a")])
        run = read_json(tmp_path / "a" / "run.json")
        assert run["spec"]["method"] == "ddtree" and run["spec"]["budget"] == 32  # not the --budget default 64
        assert run["spec"]["extra"]["labels_from"] == {"source": "server /server_info", "method": "ddtree", "budget": 32}
        assert run["version"] == 2
        assert "runs ddtree B=32" in capsys.readouterr().err
        main(base + ["--budget", "32", "--out", str(tmp_path / "b")])  # agreeing flags are fine
        assert read_json(tmp_path / "b" / "run.json")["spec"]["budget"] == 32
        with pytest.raises(SystemExit) as e:
            main(base + ["--budget", "64", "--out", str(tmp_path / "c")])
        err = capsys.readouterr().err
        assert e.value.code == 2 and "--budget 64 contradicts the server" in err and "which runs ddtree B=32" in err
        assert not (tmp_path / "c").exists()
        with pytest.raises(SystemExit) as e:
            main(base + ["--method", "ar", "--out", str(tmp_path / "d")])
        assert e.value.code == 2 and "--method ar contradicts" in capsys.readouterr().err


def test_server_without_labels_keeps_the_flags(tmp_path, capsys):
    from ddtree_bench.cli import main
    from ddtree_bench.results import read_json

    with ThreadedServer(info_app({"version": "9.9"})) as s:  # /server_info without method (not ddtree-bench serve)
        main(["run", "--backend", "openai", "--url", s.url, "--method", "ar", "--suite", "smoke", "--limit", "1",
              "--warmup", "0", "--quiet", "--out", str(tmp_path / "a")])
    run = read_json(tmp_path / "a" / "run.json")
    assert run["spec"]["method"] == "ar" and "labels_from" not in run["spec"]["extra"]
    assert run["spec"]["backend"] == "openai" and run["backend"]["kind"] == "openai"
    assert "does not say what it runs" not in capsys.readouterr().err  # --method was given
    with ThreadedServer(info_app({"version": "9.9"})) as s:
        main(["run", "--backend", "openai", "--url", s.url, "--suite", "smoke", "--limit", "1",
              "--warmup", "0", "--quiet", "--out", str(tmp_path / "b")])
    assert "the run is labelled ddtree B=64 (the --method default)" in capsys.readouterr().err


@pytest.mark.parametrize("backend,info,given,want", [
    ("sglang", {"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 16}, [], "dflash"),
    ("sglang", {"speculative_algorithm": None, "version": "0.5.23"}, [], "ar"),
    ("sglang", {"version": "0.5.23"}, [], None),            # no speculative_algorithm key: says nothing
    ("sglang", {"speculative_algorithm": "EAGLE3"}, [], "other"),   # an algorithm that is none of ours
    ("vllm", {}, [], None),                                  # vLLM has no /server_info
    ("vllm", {}, ["method"], "given"),                       # --method given: no note
])
def test_sglang_and_vllm_runs_are_labelled_from_what_the_server_says(backend, info, given, want, capsys):
    """SGLang's /server_info names its speculative_algorithm: the run is labelled from it; vLLM says nothing, so the
    --method default label is noted and recorded (explain warns on it) unless --method was given."""
    from ddtree_bench.backends.client import adopt_server_labels
    from ddtree_bench.errors import UsageError
    from ddtree_bench.run_spec import RunSpec

    with ThreadedServer(info_app(info)) as s:
        spec = adopt_server_labels(RunSpec(backend=backend, url=s.url, model="toy", method="ddtree", budget=64), given)
    err = capsys.readouterr().err
    source = (spec.extra.get("labels_from") or {}).get("source")
    if want in ("dflash", "ar"):
        assert spec.method == want and source == "server /server_info"
    elif want is None:
        assert spec.method == "ddtree" and source.startswith("--method default")
        assert "labelled ddtree B=64 (the --method default)" in err and "a DFlash deployment is --method dflash" in err
    elif want == "other":
        assert "the server runs speculative algorithm EAGLE3, which is none of ar / dflash / ddtree" in err
    else:
        assert source is None and err == ""
    with ThreadedServer(info_app(info)) as s:
        if want == "dflash":  # a contradicting flag is bad input, as with ddtree-bench serve
            with pytest.raises(UsageError, match="--method ddtree contradicts the server"):
                adopt_server_labels(RunSpec(backend=backend, url=s.url, model="toy", method="ddtree"), ["method"])


def test_an_unreachable_server_gets_one_error_and_no_note_about_labels(tmp_path, capsys):
    """Nothing listens: the run fails with exit 2 naming the URL, and does not first claim the server 'does not say
    what it runs' (it said nothing because it is not there)."""
    from ddtree_bench.cli import main
    from ddtree_bench.sweep.server import free_port

    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(SystemExit) as e:
        main(["run", "--backend", "openai", "--url", url, "--suite", "smoke", "--limit", "1", "--warmup", "0",
              "--quiet", "--out", str(tmp_path / "a")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"cannot reach the server at {url}" in err
    assert "does not say what it runs" not in err and "Traceback" not in err and not (tmp_path / "a").exists()


def test_records_of_run_json_version_1_still_read_without_token_source(tmp_path):
    import json

    from ddtree_bench.records import RequestRecord
    from ddtree_bench.results import read_records

    old = {"prompt_id": "p", "turn": 0, "prompt_ids": [1], "output_ids": [2, 3], "output_text": "ab",
           "accept_lengths": None, "accept_lengths_source": None, "num_prompt_tokens": 1, "num_output_tokens": 2,
           "finish_reason": "stop", "t_send_ns": 1, "t_first_token_ns": 2, "t_done_ns": 3, "chunk_times_ns": [2],
           "chunk_tokens": [2], "stage_ms": None, "server_stats": None, "error": None, "t_dispatch_ns": 1}
    (tmp_path / "run.json").write_text(json.dumps({"kind": "ddtree-bench-run", "version": 1, "spec": {}}))
    (tmp_path / "records.jsonl").write_text(json.dumps(old) + "\n")
    (rec,) = read_records(tmp_path)
    assert rec.output_ids == [2, 3] and rec.token_source is None
    assert json.loads(RequestRecord.from_dict(old).to_json())["token_source"] is None


@pytest.mark.parametrize("events,want", [
    ([], "bad response: the server sent no token and no finish_reason"),                    # a bare [DONE]
    ([content([1000000000, -3], "xy", "stop")], "bad response: the server's output ids hold -3, not a token id"),
    ([content(list(range(3, 27)), "x" * 24, "length")], "bad response: 24 tokens for max_tokens 8"),
])
def test_a_complete_looking_response_that_is_no_answer_is_that_requests_error(events, want):
    """Each was recorded ok before (0 tokens counted a success; negative ids made records.jsonl unreadable later)."""
    async def handler(request, body, i):
        return await stream(request, events)

    with ThreadedServer(fake_app(handler)) as s:
        (rec,) = drive_sync(backend(s.url), [Prompt("p", ["q"])], max_new_tokens=8, warmup=0)
    assert not rec.ok and rec.error == want
    assert rec.output_ids is None or all(isinstance(t, int) and t >= 0 for t in rec.output_ids)
    import json

    from ddtree_bench.records import RequestRecord
    assert RequestRecord.from_dict(json.loads(rec.to_json())).error == want   # the record stays readable


def test_an_endpoint_as_url_a_failing_or_html_model_list_and_an_html_answer_are_said_as_such(capsys):
    from aiohttp import web as W

    from ddtree_bench.backends.client import normalize_url
    from ddtree_bench.errors import UsageError

    with pytest.raises(UsageError, match="names an endpoint") as e:
        normalize_url("http://h:8000/v1/chat/completions")
    assert e.value.hint == "--url http://h:8000"
    assert normalize_url("http://h:8000/llm/v1/") == "http://h:8000/llm"   # a path prefix behind a proxy is fine

    for status, text, want in ((500, "<html>oops</html>", "failed its model list"), (200, "<html>login</html>", "no JSON model list")):
        async def models(request, st=status, t=text):
            return W.Response(status=st, text=t, content_type="text/html")

        app = W.Application()
        app.router.add_get("/v1/models", models)
        with ThreadedServer(app) as s, pytest.raises(UsageError, match=want):
            drive_sync(backend(s.url), [Prompt("p", ["q"])], warmup=0)

    async def html(request, body, i):
        return W.Response(text="<html><body>Sign in</body></html>", content_type="text/html")

    with ThreadedServer(fake_app(html)) as s:
        (rec,) = drive_sync(backend(s.url), [Prompt("p", ["q"])], warmup=0)
    assert rec.error.startswith("bad response: 200 with a text/html page, not an event stream: <html><body>Sign in")


def test_a_model_the_server_does_not_run_is_refused_by_its_hash():
    """ddtree-bench serve reports its model's hash: a standalone run with another local --model was labelled with it."""
    from ddtree_bench.backends.client import adopt_server_labels
    from ddtree_bench.engine.loading import dir_hash
    from ddtree_bench.errors import UsageError
    from ddtree_bench.pair import model_dirs

    hybrid = dir_hash(model_dirs("toy-hybrid", None)[0])
    info = {"server": "ddtree-bench serve", "model": "toy-hybrid", "model_hash": hybrid, "method": "ddtree", "budget": 16}
    with ThreadedServer(info_app(info)) as s:
        with pytest.raises(UsageError, match=r"--model toy \(.*\) is not the model the server at .* runs \(toy-hybrid"):
            adopt_server_labels(RunSpec(backend="standalone", url=s.url, model="toy"), [])
        with pytest.raises(UsageError, match=r"--model random \(random-seed-0\) is not the model"):
            adopt_server_labels(RunSpec(backend="standalone", url=s.url, model="random"), [])
        assert adopt_server_labels(RunSpec(backend="standalone", url=s.url, model="toy-hybrid"), []).budget == 16
        assert adopt_server_labels(RunSpec(backend="standalone", url=s.url, model="some/hub-id"), []).method == "ddtree"
