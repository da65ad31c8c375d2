"""`ddtree-bench serve`: an OpenAI-compatible HTTP server (aiohttp) on the reference engine.

Endpoints: `GET /health` (200, or 503 while shutting down or once the engine cannot serve: the batch engine's
thread stopped; never needs a key), `GET /v1/models`,
`GET /version`, `GET /server_info` (method, budget, block size, model paths and hashes, limits),
`GET /metrics` (Prometheus text, `server_metrics`), `POST /v1/completions` and
`POST /v1/chat/completions` (SSE streaming with `stream_options.include_usage` /
`continuous_usage_stats`, or one JSON body). Wire shapes and validation are in `openai_protocol`.

A generation request, in order: the API key (401; compared as bytes, so any header bytes are a
401, never a 500); the body, read within `read_timeout_s` (408) and at most `max_body_bytes`
(413); then, on a small thread pool and never on the event loop, strict JSON decoding, field
validation, chat-template rendering, a context check on the prompt's byte length (a prompt of B
UTF-8 bytes has at least B / (4 x the longest token in bytes) tokens, so a hopeless prompt is
refused before tokenizing), tokenization, and the exact context check (400); then its turn at
the engine (`serve_engine.Scheduler`: batch-1, arrival order, at most `max_queue` waiting, 503
beyond). Streaming sends each verify round's tokens as one SSE chunk as soon as the engine commits
them (text held back only while a UTF-8 character is incomplete, so the concatenated text equals
the decoded ids).

Disconnects: aiohttp cancels the handler of a request whose client went away (queued, running,
streaming or not); a queued request leaves the queue, a running one stops the engine at its next
round. A stream write that cannot proceed for `read_timeout_s` (a client that stopped reading)
counts the same. Such requests are counted `request_success{finished_reason="abort"}` and
`http_requests{status="499"}` (nginx's "client closed request"), never as 500, with no traceback.
Slow connections: a request head must arrive within `read_timeout_s` of connecting (or of the
previous response on a keep-alive connection), else aiohttp closes the connection.

Shutdown on SIGTERM/SIGINT: /health turns 503, new and queued requests get 503, the listening
socket closes, in-flight requests get `grace_s` to finish and are then cut (their streams end
without `[DONE]`); the process exits 0. A second signal cuts them at once.

Knows HTTP and the `serve_engine` sources; nothing of trees, suites or results files.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
import signal
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ddtree_bench import __version__
from ddtree_bench import defaults as D
from ddtree_bench.backends.openai_protocol import (
    ApiError, LogprobsText, ServeRequest, decode_body, error_body, final_usage_chunk, full_response, parse_request,
    spec_decoding_metrics, stream_chunk, usage,
)
from ddtree_bench.backends.serve_engine import Job, QueueFull, Scheduler
from ddtree_bench.backends.server_metrics import ServerMetrics
from ddtree_bench.errors import UsageError

READY_PREFIX = "ddtree-bench serve: ready at "
OPEN_PATHS = ("/health", "/version")  # answered without an API key
TOKENIZER_MARGIN = 4  # a token may cover up to 4x its own UTF-8 length of input text (normalisers)


class IncrementalText:
    """Text deltas of a growing id sequence whose concatenation equals `decode(all ids)`.

    Each `add` decodes only a window, ids[base:], and compares only that window's text (an 8k-token
    stream once cost seconds of event-loop time decoding every id so far): the text of ids[:base] is
    committed once a cut at `base` is seen to split the decoding, decode(ids[a:n]) == decode(ids[a:cut]) +
    decode(ids[cut:n]), with the left part ending in a whole character and already sent; a cut that does not
    split cleanly (inside a UTF-8 character, a decoder that strips a leading space) is simply not taken.
    Text is held back only while it ends in an incomplete character. `hold` takes ids without a delta;
    `flush` returns the rest against one full decode; `sent` is everything handed out so far.
    """

    WINDOW = 32  # ids past `base` before a commit is tried
    KEEP = 8     # ids left after the cut, as context for the next decodes

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.base = 0                      # ids[:base]: committed, their text final and sent
        self.committed: list[str] = []     # that text, in pieces (joined only by `sent`)
        self.pending = ""                  # what was sent of the text of ids[base:]

    @property
    def sent(self) -> str:
        return "".join(self.committed) + self.pending

    def add(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        window = self.tok.decode(self.ids[self.base:])
        stable = window.rstrip("\ufffd")  # hold back a partial character
        delta = ""
        if stable.startswith(self.pending):
            delta, self.pending = stable[len(self.pending):], stable
        if len(self.ids) - self.base > self.WINDOW:
            self._commit(len(self.ids) - self.KEEP, window)
        return delta

    def hold(self, ids: list[int]) -> None:
        """Take ids without decoding any delta (a non-streaming request reads only `flush`)."""
        self.ids.extend(ids)

    def _commit(self, cut: int, window: str) -> None:
        left = self.tok.decode(self.ids[self.base:cut])
        if (not left.endswith("\ufffd") and self.pending.startswith(left)
                and left + self.tok.decode(self.ids[cut:]) == window):
            self.committed.append(left)
            self.pending = self.pending[len(left):]
            self.base = cut

    def flush(self) -> str:
        text, sent = self.tok.decode(self.ids), self.sent
        delta = text[len(sent):] if text.startswith(sent) else ""
        self.committed, self.pending, self.base = [text], "", len(self.ids)
        return delta


def max_token_bytes(tokenizer) -> int | None:
    """The longest token's UTF-8 length over the whole vocabulary (added tokens too), or None if unknown."""
    vocab_of = getattr(getattr(tokenizer, "tok", None), "get_vocab", None)
    if vocab_of is None:
        return None
    return max((len(t.encode("utf-8", "surrogatepass")) for t in vocab_of(with_added_tokens=True)), default=None)


class PromptTooLong(Exception):
    def __init__(self, n_tokens: int):
        super().__init__(n_tokens)
        self.n_tokens = n_tokens


def encode(tokenizer, text: str, limit: int | None = None) -> list[int]:
    """`tokenizer.encode(text)` (as `ChatTokenizer.apply_chat_template` encodes a rendered prompt), through
    `tokenizers`' `encode_batch`, which releases the GIL, so a 7 MB prompt does not stall the event loop.
    More than `limit` tokens raise `PromptTooLong` before the id list is built."""
    batch = getattr(getattr(tokenizer, "tok", None), "encode_batch", None)
    if batch is None:
        ids = tokenizer.encode(text)
        if limit is not None and len(ids) > limit:
            raise PromptTooLong(len(ids))
        return ids
    enc = batch([text], add_special_tokens=False)[0]
    if limit is not None and len(enc) > limit:
        raise PromptTooLong(len(enc))
    return list(enc.ids)


class ServerState:
    def __init__(self, source, api_key: str | None, max_queue: int, read_timeout_s: float, cpu_workers: int):
        self.source = source
        self.api_key = api_key
        self.key_bytes = f"Bearer {api_key}".encode("utf-8") if api_key else b""
        self.max_queue = max_queue
        self.read_timeout_s = read_timeout_s
        self.metrics = ServerMetrics(source.model_id, source.block_size)
        self.scheduler = Scheduler(source.serial, max_queue, self._gauges)
        self.cpu = ThreadPoolExecutor(cpu_workers, thread_name_prefix="ddtree-serve-cpu")
        self.max_token_bytes = max_token_bytes(source.tokenizer)
        self.draining = False
        self.jobs: set[Job] = set()
        self.started = time.time()

    def _gauges(self, waiting: int, running: int) -> None:
        self.metrics.gauge_set("num_requests_waiting", waiting)
        self.metrics.gauge_set("num_requests_running", running)

    def authorized(self, request: web.Request) -> bool:
        got = request.headers.get("Authorization", "")  # aiohttp: UTF-8 with surrogateescape, so this is the raw bytes
        return hmac.compare_digest(got.encode("utf-8", "surrogateescape"), self.key_bytes)

    def server_info(self) -> dict[str, Any]:
        s = self.source
        return {"version": __version__, "server": "ddtree-bench serve", "model": s.model_id, "method": s.method,
                "budget": s.budget if s.method == "ddtree" else None, "block_size": s.block_size,
                "max_model_len": s.max_model_len, "stop_ids": s.stop_ids, "max_queue": self.max_queue,
                "read_timeout_s": self.read_timeout_s, "auth": bool(self.api_key), "started": int(self.started), **s.info}


STATE = web.AppKey("state", ServerState)
MAX_BODY = web.AppKey("max_body_bytes", int)


class _ClientGone(Exception):
    """A write to the client failed or stalled past the read timeout."""


_ENCODE = json.JSONEncoder(ensure_ascii=False).encode  # json.dumps(obj, ensure_ascii=False) builds one a call


def _sse(obj: Any) -> bytes:
    return b"data: " + _ENCODE(obj).encode() + b"\n\n"


def _error(status: int, message: str, type_: str = "invalid_request_error") -> web.Response:
    return web.json_response(error_body(status, message, type_), status=status)


@web.middleware
async def _middleware(request: web.Request, handler):
    st: ServerState = request.app[STATE]
    path = request.path
    endpoint = path if request.match_info.route.resource is not None else "other"  # bounded label set
    if st.api_key and path not in OPEN_PATHS and not st.authorized(request):
        st.metrics.inc("http_requests", endpoint=endpoint, status="401")
        return _error(401, "invalid or missing API key (send 'Authorization: Bearer KEY')", "authentication_error")
    try:
        resp = await handler(request)
    except asyncio.CancelledError:  # the client went away (or a shutdown cut the request)
        st.metrics.inc("http_requests", endpoint=endpoint, status="499")
        raise
    except _ClientGone:
        resp = _error(499, "the client went away", "client_closed_request")
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
    st: ServerState = request.app[STATE]
    if st.draining:
        return _error(503, "shutting down", "server_error")
    failure = getattr(st.source, "failure", None)
    why = failure() if failure is not None else None
    if why:
        return _error(503, why, "server_error")
    return web.json_response({"status": "ok"})


def _model_card(st: "ServerState") -> dict[str, Any]:
    s = st.source
    return {"id": s.model_id, "object": "model", "created": int(st.started), "owned_by": "ddtree-bench",
            "root": s.info.get("model_path") or s.model_id, "max_model_len": s.max_model_len}


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [_model_card(request.app[STATE])]})


async def _model(request: web.Request) -> web.Response:
    """GET /v1/models/{id}: the one model's card, or 404 naming the model served (OpenAI's retrieve-model)."""
    st: ServerState = request.app[STATE]
    want = request.match_info["model"]
    if want != st.source.model_id:
        return _error(404, f"the model '{want}' does not exist; this server serves '{st.source.model_id}'", "not_found_error")
    return web.json_response(_model_card(st))


async def _version(request: web.Request) -> web.Response:
    return web.json_response({"version": __version__})


async def _server_info(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE].server_info())


async def _metrics(request: web.Request) -> web.Response:
    return web.Response(text=request.app[STATE].metrics.render(), content_type="text/plain",
                        headers={"X-Prometheus-Format": "0.0.4"})


# ---------------------------------------------------------------------------- preparing a request (CPU pool)


@dataclass
class Prepared:
    """A validated request with its prompt tokenized and the stop ids it generates against."""

    req: ServeRequest
    prompt_ids: list[int]
    stop_ids: list[int]


def _context_error(n_tokens: str, req: ServeRequest, limit: int) -> ApiError:
    """n_tokens: the prompt's size as words, e.g. "812 tokens" or "at least 1 token"."""
    return ApiError(400, f"prompt ({n_tokens}) + max_tokens ({req.max_tokens}) exceeds the model's context of "
                    f"{limit} tokens", param="max_tokens")


def prepare(st: ServerState, raw: bytes, kind: str) -> Prepared:
    """Decode, validate and tokenize one body (CPU work: runs on `st.cpu`, never on the event loop)."""
    src = st.source
    req = parse_request(decode_body(raw), kind, src.model_id, src.vocab_size)
    if req.logprobs is not None and not getattr(src, "logprobs", False):
        raise ApiError(400, "logprobs need a model: the null engine has none", param="logprobs")
    limit = src.max_model_len
    if req.max_tokens >= limit:
        raise _context_error("at least 1 token", req, limit)
    tok = src.tokenizer
    if req.kind == "chat":
        try:
            text = tok.render(req.messages, add_generation_prompt=True, enable_thinking=req.enable_thinking)
        except UsageError as e:  # the template's raise_exception (e.g. roles out of order)
            raise ApiError(400, f"cannot render the chat template: {e}", param="messages") from None
    else:
        text = req.prompt_text
    room = limit - req.max_tokens  # prompt tokens that fit
    if text is not None and st.max_token_bytes:  # a lower bound on the token count, before tokenizing
        nbytes = len(text.encode("utf-8"))
        at_least = -(-nbytes // (TOKENIZER_MARGIN * st.max_token_bytes))
        if at_least > room:
            raise _context_error(f"at least {at_least} tokens: {nbytes} bytes of text", req, limit)
    try:
        ids = req.prompt_ids if text is None else encode(tok, text, room)
    except PromptTooLong as e:
        raise _context_error(f"{e.n_tokens} tokens", req, limit) from None
    if not ids:
        raise ApiError(400, "the prompt is empty after tokenization", param="prompt")
    if len(ids) + req.max_tokens > limit:
        raise _context_error(f"{len(ids)} tokens", req, limit)
    stop = list(req.stop_token_ids or []) + ([] if req.ignore_eos else src.stop_ids)
    return Prepared(req, ids, stop)


async def _read_body(request: web.Request, st: ServerState) -> bytes:
    try:  # over client_max_size -> HTTPRequestEntityTooLarge -> 413
        return await asyncio.wait_for(request.read(), st.read_timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {st.read_timeout_s:g} s", "timeout_error") from None
    except ConnectionError as e:  # the client went away mid-body (wait_for may surface this instead of the cancel)
        raise _ClientGone(type(e).__name__) from None


# ---------------------------------------------------------------------------- generation


def _count(st: ServerState, job: Job, reason: str) -> None:
    """Count a request's outcome once (a cancellation after the last chunk does not recount it)."""
    if job.outcome is None:
        job.outcome = reason
        st.metrics.inc("request_success", finished_reason=reason)


async def _generate(request: web.Request, kind: str) -> web.StreamResponse:
    t_arrival = time.perf_counter_ns()
    st: ServerState = request.app[STATE]
    raw = await _read_body(request, st)
    prep = await asyncio.get_running_loop().run_in_executor(st.cpu, prepare, st, raw, kind)
    if st.draining:
        return _error(503, "the server is shutting down", "server_error")
    req = prep.req
    seed = req.seed if req.seed is not None or req.temperature < D.GREEDY_EPS else secrets.randbits(63)  # OpenAI: a fresh sample
    job = Job(prep.prompt_ids, req.max_tokens, req.temperature, req.top_p, seed, prep.stop_ids, logprobs=req.logprobs)
    try:
        async with st.scheduler.turn():
            if st.draining:
                return _error(503, "the server is shutting down", "server_error")
            st.metrics.observe("request_queue_time_seconds", (time.perf_counter_ns() - t_arrival) / 1e9)
            st.jobs.add(job)
            try:
                return await _run(request, st, req, job, t_arrival)
            finally:
                st.jobs.discard(job)
    except QueueFull as e:
        return _error(503, str(e), "server_error")
    except asyncio.CancelledError:  # the client went away, queued or running: the engine stops at its next round
        job.cancelled = True
        _count(st, job, "abort")
        raise


async def _write(st: ServerState, request: web.Request, resp: web.StreamResponse, data: bytes) -> None:
    """Write to a stream; one that stalls past the read timeout means the client stopped reading.

    aiohttp's write waits only in its drain, and only while the transport is paused: writing more than the
    high-water mark of unsent bytes pauses it, and it stays paused until they fall to the low-water mark. With
    nothing unsent (so not paused) a write no longer than that mark cannot stall, so it goes without a timer
    (wait_for's task costs an event-loop pass a chunk on Python < 3.12, and each pass polls the selector,
    handing the GIL to the engine thread)."""
    tr = request.transport
    limits = getattr(tr, "get_write_buffer_limits", None)   # asyncio's transports have it; another may not
    try:
        if limits is not None and tr.get_write_buffer_size() == 0 and len(data) <= limits()[1]:
            await resp.write(data)
        else:
            await asyncio.wait_for(resp.write(data), st.read_timeout_s)
    except (asyncio.TimeoutError, ConnectionError, RuntimeError) as e:  # RuntimeError: aiohttp's closed transport
        raise _ClientGone(type(e).__name__) from None


async def _open_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    try:
        await resp.prepare(request)
    except (ConnectionError, RuntimeError) as e:
        raise _ClientGone(type(e).__name__) from None
    return resp


async def _run(request: web.Request, st: ServerState, req: ServeRequest, job: Job, t_arrival: int) -> web.StreamResponse:
    src = st.source
    text = IncrementalText(src.tokenizer)
    out_ids: list[int] = []
    lp_text = LogprobsText(req.kind, lambda i: src.tokenizer.decode([i], skip_special_tokens=False))
    lp_all: list = []
    P = len(job.prompt_ids)
    resp: web.StreamResponse | None = None
    t_last: int | None = None
    done = None
    try:
        async with aclosing(src.stream(job)) as events:
            async for ev in events:
                if ev.kind != "tokens":
                    done = ev
                    continue
                out_ids.extend(ev.tokens)
                lp_all.extend(ev.logprobs or [])
                if not req.stream:   # one body at the end: no deltas to decode on the way
                    text.hold(ev.tokens)
                else:
                    delta = text.add(ev.tokens)
                    first = resp is None
                    if first:
                        resp = await _open_stream(request)
                    chunk = stream_chunk(req, delta, ev.tokens, first=first, prompt_ids=job.prompt_ids,
                                         usage_now=usage(P, len(out_ids)) if req.continuous_usage else None,
                                         logprobs=lp_text.body(ev.logprobs))
                    await _write(st, request, resp, _sse(chunk))
                now = time.perf_counter_ns()  # the tokens are on their way (streaming) or buffered
                if t_last is None:
                    st.metrics.observe("time_to_first_token_seconds", (now - t_arrival) / 1e9)
                else:
                    st.metrics.observe("inter_token_latency_seconds", (now - t_last) / 1e9 / len(ev.tokens), len(ev.tokens))
                t_last = now
    except _ClientGone:  # the client stopped reading or went away: stop generating
        job.cancelled = True
        _count(st, job, "abort")
        return resp if resp is not None else _error(499, "the client went away", "client_closed_request")
    if done is None or done.kind == "cancelled":
        _count(st, job, "abort")
        if resp is None:
            return _error(503, "the request was cancelled (server shutting down)", "server_error")
        return resp  # cut: no [DONE]
    if done.kind == "error":
        print(f"ddtree-bench serve: engine error: {done.error}", file=sys.stderr, flush=True)
        _count(st, job, "error")
        if resp is None:
            return _error(500, f"engine error: {done.error}", "server_error")
        try:
            await _write(st, request, resp, _sse(error_body(500, f"engine error: {done.error}", "server_error")))
            await _write(st, request, resp, b"data: [DONE]\n\n")
        except _ClientGone:
            pass
        return resp

    tail = text.flush()
    spec = spec_decoding_metrics(src.method, done.accept_lengths or [], src.block_size, src.budget)
    u = usage(P, len(out_ids))
    _count(st, job, done.finish_reason)
    st.metrics.inc("prompt_tokens", P)
    st.metrics.inc("generation_tokens", len(out_ids))
    st.metrics.observe("e2e_request_latency_seconds", (time.perf_counter_ns() - t_arrival) / 1e9)
    st.metrics.spec_request(src.method, done.accept_lengths or [], len(done.accept_lengths or []) * src.draft_tokens_per_round())
    if not req.stream:
        return web.json_response(full_response(req, text.sent, out_ids, job.prompt_ids, done.finish_reason, u, spec,
                                               logprobs=lp_text.body(lp_all if req.logprobs is not None else None)))
    try:
        if resp is None:  # nothing was generated (cannot happen with max_tokens >= 1, but stay well-formed)
            resp = await _open_stream(request)
        await _write(st, request, resp, _sse(stream_chunk(req, tail, [], finish_reason=done.finish_reason, first=not out_ids,
                                                 prompt_ids=job.prompt_ids, usage_now=u if req.continuous_usage else None)))
        if req.include_usage:
            await _write(st, request, resp, _sse(final_usage_chunk(req, u, spec)))
        await _write(st, request, resp, b"data: [DONE]\n\n")
    except _ClientGone:
        pass
    return resp


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completions")


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


class _OneLine(logging.Formatter):
    """aiohttp's own log lines (malformed HTTP it answers 400 itself) without their tracebacks."""

    def format(self, record: logging.LogRecord) -> str:
        exc = record.exc_info[1] if record.exc_info else None
        msg = record.getMessage() + (f": {type(exc).__name__}: {' '.join(str(exc).split())[:300]}" if exc else "")
        return f"ddtree-bench serve: {msg}"


def _quiet_aiohttp_logs() -> None:
    log = logging.getLogger("aiohttp.server")
    if not any(isinstance(h.formatter, _OneLine) for h in log.handlers):
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(_OneLine())
        log.addHandler(h)
        log.propagate = False


def build_app(source, *, api_key: str | None = None, max_queue: int = D.SERVE_MAX_QUEUE,
              max_body_bytes: int = D.SERVE_MAX_BODY_BYTES, read_timeout_s: float = D.SERVE_READ_TIMEOUT_S,
              cpu_workers: int = D.SERVE_CPU_WORKERS) -> web.Application:
    """The aiohttp application around a token source (`serve_engine.EngineSource` or `NullSource`).

    Its handler arguments make any runner cancel the handler of a vanished client and close a
    connection whose request head does not arrive within `read_timeout_s`."""
    _quiet_aiohttp_logs()
    app = web.Application(middlewares=[_middleware], client_max_size=max_body_bytes,
                          handler_args={"handler_cancellation": True, "keepalive_timeout": read_timeout_s})
    st = ServerState(source, api_key, max_queue, read_timeout_s, cpu_workers)
    app[STATE] = st
    app[MAX_BODY] = max_body_bytes

    async def close_pool(_app) -> None:
        st.cpu.shutdown(wait=False, cancel_futures=True)

    app.on_cleanup.append(close_pool)
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/v1/models/{model:.+}", _model)
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
                max_body_bytes: int = D.SERVE_MAX_BODY_BYTES, read_timeout_s: float = D.SERVE_READ_TIMEOUT_S,
                on_ready=None) -> None:
    """Serve until SIGTERM/SIGINT; then drain (see the module docstring) and return."""
    app = build_app(source, api_key=api_key, max_queue=max_queue, max_body_bytes=max_body_bytes,
                    read_timeout_s=read_timeout_s)
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
