"""`ddtree-bench serve`: an OpenAI-compatible HTTP server (aiohttp) on the reference engine.

Endpoints: `GET /health` (200, or 503 while shutting down; never needs a key), `GET /v1/models`,
`GET /version`, `GET /server_info` (method, budget, block size, model paths and hashes, limits),
`GET /metrics` (Prometheus text, `server_metrics`), `POST /v1/completions` and
`POST /v1/chat/completions` (SSE streaming with `stream_options.include_usage` /
`continuous_usage_stats`, or one JSON body). Wire shapes and validation are in `openai_protocol`.

Scheduling: the engine is batch-1, so requests run one at a time in arrival order (a fair lock);
at most `max_queue` may wait, beyond that 503. Streaming sends each verify round's tokens as one
SSE chunk as soon as the engine commits them (text held back only while a UTF-8 character is
incomplete, so the concatenated text equals the decoded ids). A client that disconnects, and a
shutdown past its grace period, stop the generation at its next round.

Shutdown on SIGTERM/SIGINT: /health turns 503, new and queued requests get 503, the listening
socket closes, in-flight requests get `grace_s` to finish and are then cut (their streams end
without `[DONE]`); the process exits 0. A second signal cuts them at once.

Knows HTTP and the `serve_engine` sources; nothing of trees, suites or results files.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import signal
import sys
import time
import traceback
from contextlib import aclosing
from typing import Any

from aiohttp import web

from ddtree_bench import __version__
from ddtree_bench import defaults as D
from ddtree_bench.backends.openai_protocol import (
    ApiError, ServeRequest, error_body, final_usage_chunk, full_response, parse_request, spec_decoding_metrics,
    stream_chunk, usage,
)
from ddtree_bench.backends.serve_engine import Job
from ddtree_bench.backends.server_metrics import ServerMetrics
from ddtree_bench.errors import UsageError

READY_PREFIX = "ddtree-bench serve: ready at "
LOOPBACK = ("127.0.0.1", "localhost", "::1")
OPEN_PATHS = ("/health", "/version")  # answered without an API key


class IncrementalText:
    """Text deltas of a growing id sequence whose concatenation equals `decode(all ids)`."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.sent = ""

    def add(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        stable = self.tok.decode(self.ids).rstrip("\ufffd")  # hold back a possibly incomplete character
        if not stable.startswith(self.sent):
            return ""
        delta, self.sent = stable[len(self.sent):], stable
        return delta

    def flush(self) -> str:
        text = self.tok.decode(self.ids)
        delta = text[len(self.sent):] if text.startswith(self.sent) else ""
        self.sent = text
        return delta


class ServerState:
    def __init__(self, source, api_key: str | None, max_queue: int):
        self.source = source
        self.api_key = api_key
        self.max_queue = max_queue
        self.metrics = ServerMetrics(source.model_id, source.block_size)
        self.lock = asyncio.Lock()
        self.waiting = 0
        self.draining = False
        self.jobs: set[Job] = set()
        self.started = time.time()

    def server_info(self) -> dict[str, Any]:
        s = self.source
        return {"version": __version__, "server": "ddtree-bench serve", "model": s.model_id, "method": s.method,
                "budget": s.budget if s.method == "ddtree" else None, "block_size": s.block_size,
                "max_model_len": s.max_model_len, "stop_ids": s.stop_ids, "max_queue": self.max_queue,
                "auth": bool(self.api_key), "started": int(self.started), **s.info}


STATE = web.AppKey("state", ServerState)
MAX_BODY = web.AppKey("max_body_bytes", int)


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


def _error(status: int, message: str, type_: str = "invalid_request_error") -> web.Response:
    return web.json_response(error_body(status, message, type_), status=status)


@web.middleware
async def _middleware(request: web.Request, handler):
    st: ServerState = request.app[STATE]
    path = request.path
    endpoint = path if request.match_info.route.resource is not None else "other"  # bounded label set
    if st.api_key and path not in OPEN_PATHS:
        got = request.headers.get("Authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {st.api_key}".encode()):
            st.metrics.inc("http_requests", endpoint=endpoint, status="401")
            return _error(401, "invalid or missing API key (send 'Authorization: Bearer KEY')", "authentication_error")
    try:
        resp = await handler(request)
    except ApiError as e:
        resp = web.json_response(e.body(), status=e.status)
    except web.HTTPException as e:  # 404/405 routes, 413 bodies: OpenAI-style JSON
        if e.status == 413:
            msg = f"the request body is larger than {request.app[MAX_BODY]} bytes"
        else:
            msg = f"{e.reason}: {request.method} {path}"
        resp = _error(e.status, msg, "invalid_request_error" if e.status < 500 else "server_error")
    except Exception as e:  # a server bug: say so in the log and to the client, keep serving
        traceback.print_exc(file=sys.stderr)
        resp = _error(500, f"internal server error: {type(e).__name__}: {e}", "server_error")
    st.metrics.inc("http_requests", endpoint=endpoint, status=str(resp.status))
    return resp


# ---------------------------------------------------------------------------- simple endpoints


async def _health(request: web.Request) -> web.Response:
    if request.app[STATE].draining:
        return _error(503, "shutting down", "server_error")
    return web.json_response({"status": "ok"})


async def _models(request: web.Request) -> web.Response:
    st: ServerState = request.app[STATE]
    s = st.source
    return web.json_response({"object": "list", "data": [{
        "id": s.model_id, "object": "model", "created": int(st.started), "owned_by": "ddtree-bench",
        "root": s.info.get("model_path") or s.model_id, "max_model_len": s.max_model_len}]})


async def _version(request: web.Request) -> web.Response:
    return web.json_response({"version": __version__})


async def _server_info(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE].server_info())


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(text=request.app[STATE].metrics.render(), content_type="text/plain",
                        headers={"X-Prometheus-Format": "0.0.4"})


# ---------------------------------------------------------------------------- generation


def _prompt_ids(st: ServerState, req: ServeRequest) -> list[int]:
    tok = st.source.tokenizer
    if req.kind == "chat":
        try:
            ids = tok.apply_chat_template(req.messages, enable_thinking=req.enable_thinking)
        except UsageError as e:  # the template's raise_exception (e.g. roles out of order)
            raise ApiError(400, f"cannot render the chat template: {e}", param="messages") from None
    else:
        ids = req.prompt_ids if req.prompt_ids is not None else tok.encode(req.prompt_text)
    if not ids:
        raise ApiError(400, "the prompt is empty after tokenization", param="prompt")
    limit = st.source.max_model_len
    if len(ids) + req.max_tokens > limit:
        raise ApiError(400, f"prompt ({len(ids)} tokens) + max_tokens ({req.max_tokens}) exceeds the model's "
                       f"context of {limit} tokens", param="max_tokens")
    return ids


async def _generate(request: web.Request, kind: str) -> web.StreamResponse:
    t_arrival = time.perf_counter_ns()
    st: ServerState = request.app[STATE]
    src = st.source
    raw = await request.read()  # over client_max_size -> HTTPRequestEntityTooLarge -> 413
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON ({e})") from None
    req = parse_request(obj, kind, src.model_id, src.vocab_size)
    prompt_ids = _prompt_ids(st, req)
    stop = list(req.stop_token_ids or []) + ([] if req.ignore_eos else src.stop_ids)
    if st.draining:
        return _error(503, "the server is shutting down", "server_error")
    if src.serial and st.lock.locked() and st.waiting >= st.max_queue:
        return _error(503, f"the queue is full ({st.waiting} requests waiting, --max-queue {st.max_queue})", "server_error")

    job = Job(prompt_ids, req.max_tokens, req.temperature, req.top_p, req.seed, stop)
    st.waiting += 1
    st.metrics.gauge_add("num_requests_waiting", 1)
    try:
        if src.serial:
            await st.lock.acquire()
    finally:
        st.waiting -= 1
        st.metrics.gauge_add("num_requests_waiting", -1)
    try:
        if st.draining:
            return _error(503, "the server is shutting down", "server_error")
        st.metrics.observe("request_queue_time_seconds", (time.perf_counter_ns() - t_arrival) / 1e9)
        st.metrics.gauge_add("num_requests_running", 1)
        try:
            st.jobs.add(job)
            return await _run(request, st, req, job, t_arrival)
        finally:
            st.jobs.discard(job)
            st.metrics.gauge_add("num_requests_running", -1)
    finally:
        if src.serial:
            st.lock.release()


async def _run(request: web.Request, st: ServerState, req: ServeRequest, job: Job, t_arrival: int) -> web.StreamResponse:
    src = st.source
    text = IncrementalText(src.tokenizer)
    out_ids: list[int] = []
    P = len(job.prompt_ids)
    resp: web.StreamResponse | None = None
    t_last: int | None = None
    done = None
    async with aclosing(src.stream(job)) as events:
        async for ev in events:
            if ev.kind == "tokens":
                out_ids.extend(ev.tokens)
                delta = text.add(ev.tokens)
                if req.stream:
                    first = resp is None
                    if first:
                        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
                        await resp.prepare(request)
                    chunk = stream_chunk(req, delta, ev.tokens, first=first, prompt_ids=job.prompt_ids,
                                         usage_now=usage(P, len(out_ids)) if req.continuous_usage else None)
                    try:
                        await resp.write(_sse(chunk))
                    except (ConnectionError, RuntimeError):  # the client went away: stop generating
                        job.cancelled = True
                        st.metrics.inc("request_success", finished_reason="abort")
                        return resp
                now = time.perf_counter_ns()  # the tokens are on their way (streaming) or buffered
                if t_last is None:
                    st.metrics.observe("time_to_first_token_seconds", (now - t_arrival) / 1e9)
                else:
                    st.metrics.observe("inter_token_latency_seconds", (now - t_last) / 1e9 / len(ev.tokens), len(ev.tokens))
                t_last = now
            else:
                done = ev
    if done is None or done.kind == "cancelled":
        st.metrics.inc("request_success", finished_reason="abort")
        if resp is None:
            return _error(503, "the request was cancelled (server shutting down)", "server_error")
        return resp  # cut: no [DONE]
    if done.kind == "error":
        print(f"ddtree-bench serve: engine error: {done.error}", file=sys.stderr, flush=True)
        st.metrics.inc("request_success", finished_reason="error")
        if resp is None:
            return _error(500, f"engine error: {done.error}", "server_error")
        await resp.write(_sse(error_body(500, f"engine error: {done.error}", "server_error")))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    tail = text.flush()
    spec = spec_decoding_metrics(src.method, done.accept_lengths or [], src.block_size, src.budget)
    u = usage(P, len(out_ids))
    st.metrics.inc("request_success", finished_reason=done.finish_reason)
    st.metrics.inc("prompt_tokens", P)
    st.metrics.inc("generation_tokens", len(out_ids))
    st.metrics.observe("e2e_request_latency_seconds", (time.perf_counter_ns() - t_arrival) / 1e9)
    st.metrics.spec_request(src.method, done.accept_lengths or [], len(done.accept_lengths or []) * src.draft_tokens_per_round())
    if not req.stream:
        return web.json_response(full_response(req, text.sent, out_ids, job.prompt_ids, done.finish_reason, u, spec))
    if resp is None:  # nothing was generated (cannot happen with max_tokens >= 1, but stay well-formed)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
    try:
        await resp.write(_sse(stream_chunk(req, tail, [], finish_reason=done.finish_reason, first=not out_ids,
                                           prompt_ids=job.prompt_ids,
                                           usage_now=u if req.continuous_usage else None)))
        if req.include_usage:
            await resp.write(_sse(final_usage_chunk(req, u, spec)))
        await resp.write(b"data: [DONE]\n\n")
    except (ConnectionError, RuntimeError):
        pass
    return resp


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completions")


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


def build_app(source, *, api_key: str | None = None, max_queue: int = D.SERVE_MAX_QUEUE,
              max_body_bytes: int = D.SERVE_MAX_BODY_BYTES) -> web.Application:
    """The aiohttp application around a token source (`serve_engine.EngineSource` or `NullSource`)."""
    app = web.Application(middlewares=[_middleware], client_max_size=max_body_bytes)
    app[STATE] = ServerState(source, api_key, max_queue)
    app[MAX_BODY] = max_body_bytes
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/version", _version)
    app.router.add_get("/server_info", _server_info)
    app.router.add_get("/metrics", _metrics)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _chat)
    return app


def url_for(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def serve(source, *, host: str = D.HOST, port: int = D.PORT, api_key: str | None = None,
                max_queue: int = D.SERVE_MAX_QUEUE, grace_s: float = D.SERVE_SHUTDOWN_GRACE_S,
                max_body_bytes: int = D.SERVE_MAX_BODY_BYTES, on_ready=None) -> None:
    """Serve until SIGTERM/SIGINT; then drain (see the module docstring) and return."""
    app = build_app(source, api_key=api_key, max_queue=max_queue, max_body_bytes=max_body_bytes)
    st: ServerState = app[STATE]
    runner = web.AppRunner(app, shutdown_timeout=grace_s, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}",
                         hint="pick another --port (0 = any free port)") from None
    bound_port = runner.addresses[0][1]
    url = url_for(host, bound_port)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        st.draining = True
        stop.set()
        if signals > 1:  # second signal: cut in-flight requests now
            for job in list(st.jobs):
                job.cancelled = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        if on_ready is not None:
            on_ready(url)
        await stop.wait()
        print(f"ddtree-bench serve: shutting down ({len(st.jobs)} in flight, up to {grace_s:g}s to finish)",
              file=sys.stderr, flush=True)
        await runner.cleanup()  # closes the socket, waits up to grace_s for handlers, then cancels them
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        for job in list(st.jobs):
            job.cancelled = True
        source.close()
