"""The OpenAI-compatible HTTP client: one backend for `standalone` (ddtree-bench serve), `sglang`,
`vllm`, `llamacpp` (llama.cpp's llama-server) and `openai` (any other OpenAI-compatible server) servers.

Requests stream by default (`stream: true` with `stream_options.include_usage`; `--no-stream` asks
for one JSON body) from `/v1/chat/completions` (messages; the server renders its chat template) or
`/v1/completions` (the conversation rendered on the client with the model's local tokenizer: token
ids, the exact-parity path; plain text for `openai`). Sampling is always explicit: `temperature`,
`top_p`, `max_tokens`, `seed`. What else a request carries depends on the server
(docs/openai-compat.md has the table):

* standalone, vllm: `return_token_ids` (ids per chunk), `stream_options.continuous_usage_stats`,
  `chat_template_kwargs.enable_thinking = false`, `stop_token_ids` when set;
* sglang: the same, plus `return_spec_tokens_details`; but SGLang refuses `return_token_ids` on
  streamed chat (400), so streamed chat asks for `return_output_ids_in_sglext` /
  `return_input_ids_in_sglext` instead (the ids arrive whole in one `sglext` chunk at the end;
  per-chunk counts come from the continuous usage);
* llamacpp: prompt token ids on completions, `return_tokens` + `verbose` (ids per chunk in
  `__verbose.tokens`), `timings_per_token` (each chunk's cumulative `timings.draft_n` /
  `draft_n_accepted`, from which `parsers` rebuilds the rounds), `top_k: 0` and `min_p: 0` (its
  sampler defaults are 40 and 0.05: not neutral at T > 0), `cache_prompt: false` (each request
  from an empty cache, as the reference runs it), `chat_template_kwargs.enable_thinking = false`;
  no `stop_token_ids` (it stops on the vocabulary's end-of-generation tokens). Streamed chat chunks
  carry no token ids: the text is re-tokenized locally, as for `openai` (`token_source` says so);
* openai: standard fields only (servers such as `transformers serve` answer 422 to vendor fields).
  Token ids are the server's if it sends any, else the output text tokenized with the model's
  local tokenizer (`RequestRecord.token_source` = "retokenized"; per-chunk counts then come from
  tokenizing the growing text, so ITL stays per token).

One `aiohttp.ClientSession` (one keep-alive pool) serves the whole run. Servers may close a kept-alive
connection between requests (llama-server closes it after every streamed response although its headers
say keep-alive); a request sent on such a reused connection fails before the server read it. So a
request whose reused connection breaks before any response byte arrives is sent once more on a fresh
connection (`stale_connection_retries` in describe() counts them), and connections to llama-server
are not reused at all (one connection per request, `force_close`). Each SSE read is stamped with
`time.perf_counter_ns()`; a chunk's token count comes from its token ids (see `parsers`), so a
k-token speculative chunk is k tokens for ITL. A stream is complete when it ends with `data: [DONE]`
or after a chunk with a `finish_reason` (transformers serve sends no `[DONE]`, as the official
`openai` client accepts); one that ends with neither is truncated.

Failures of one request become its `error` ("timeout: ...", "http 503: <server message>",
"connection: ...", "truncated stream: ...", "server error: ..."); an unreachable server at `start()`
raises `UsageError` naming the URL. `describe()` records the served model ids and what the server
says about itself (`/version`, `/server_info`). `adopt_server_labels` takes a run's method/budget
labels from a server that reports them (`ddtree-bench serve`'s /server_info) before the run starts.

Knows HTTP and response shapes (through `parsers`); nothing of trees, suites or metrics.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ddtree_bench import defaults as D
from ddtree_bench.backends.parsers import ResponseError, StreamState, accept_lengths_from_stats, error_message
from ddtree_bench.errors import UsageError
from ddtree_bench.pair import BUNDLED
from ddtree_bench.records import GenerationRequest, RequestRecord
from ddtree_bench.run_spec import method_label

KINDS = ("standalone", "sglang", "vllm", "openai", "llamacpp")
VENDOR_KINDS = ("standalone", "sglang", "vllm")  # servers we know: they get their extension fields
ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
# What run.json keeps of SGLang's (large) /server_info.
SGLANG_INFO_KEYS = ("version", "model_path", "served_model_name", "dtype", "tp_size", "dp_size", "attention_backend",
                    "max_running_requests", "enable_deterministic_inference", "sampling_defaults", "launch_command")


def normalize_url(url: str) -> str:
    """'http://h:p/' or 'http://h:p/v1' -> 'http://h:p'. Raises UsageError for anything that is not http(s)://host."""
    u = url.strip().rstrip("/")
    for endpoint in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/chat/completions", "/completions"):
        if u.endswith(endpoint):
            raise UsageError(f"--url {url!r} names an endpoint; --url is the server's base URL",
                             hint=f"--url {u[:-len(endpoint)] or u}")
    if u.endswith("/v1"):
        u = u[:-3]
    parts = urlsplit(u)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"--url {url!r} is not an http(s) URL", hint="e.g. --url http://127.0.0.1:8000")
    return u


def local_tokenizer(model: str):
    """The chat tokenizer of --model when it is on this machine (`random`, `toy`, a directory with
    tokenizer.json), else None."""
    from ddtree_bench.tokenizer import ChatTokenizer

    if model == "random":
        import tempfile

        from ddtree_bench.toy.tokenizer import write_tokenizer

        with tempfile.TemporaryDirectory(prefix="ddtree-bench-tok-") as tmp:
            write_tokenizer(Path(tmp))
            return ChatTokenizer(tmp)
    if model in BUNDLED:
        from ddtree_bench.pair import model_dirs

        path = model_dirs(model, None)[0]
    else:
        path = Path(model).expanduser()
    return ChatTokenizer(path) if (path / "tokenizer.json").exists() else None


class HTTPBackend:
    """Drives one OpenAI-compatible server. Create with `from_spec`; `drive` calls start/aclose."""

    def __init__(self, kind: str, url: str, *, model: str, endpoint: str = "chat", api_key: str | None = None,
                 timeout_s: float = D.REQUEST_TIMEOUT_S, stop_ids: list[int] | None = None,
                 extra_body: dict[str, Any] | None = None, stream: bool = True):
        if kind not in KINDS:
            raise UsageError(f"unknown HTTP backend {kind!r}; expected one of {', '.join(KINDS)}")
        if endpoint not in ENDPOINTS:
            raise UsageError(f"unknown --endpoint {endpoint!r}; expected chat or completions")
        if not timeout_s > 0:
            raise UsageError(f"--timeout must be > 0 seconds, got {timeout_s!r}")
        self.kind = kind
        self.url = normalize_url(url)
        self.model = model
        self.endpoint = endpoint
        self.api_key = api_key
        self.timeout_s = float(timeout_s)
        self.stop_ids = list(stop_ids) if stop_ids is not None else None
        self.extra_body = dict(extra_body or {})
        self.stream = bool(stream)
        self.served_model: str | None = None
        self.block_size = 16
        self.info: dict[str, Any] = {}
        self.tokenizer = None
        self.connections_opened = 0  # TCP connections the pool opened (keep-alive: about one per concurrent request)
        self.stale_connection_retries = 0  # requests re-sent because their reused connection was already closed
        self._fresh = None  # a session without keep-alive, for those re-sends
        self.concurrency: int | None = None  # the run's closed-loop concurrency (set by from_spec), for batching()
        self._session = None

    @classmethod
    def from_spec(cls, spec) -> "HTTPBackend":
        if not spec.url:
            raise UsageError(f"--backend {spec.backend} needs --url (the server's base URL)")
        b = cls(spec.backend, spec.url, model=spec.model, endpoint=spec.endpoint, api_key=spec.api_key,
                timeout_s=spec.timeout_s, stop_ids=spec.stop_ids, extra_body=spec.extra.get("extra_body"),
                stream=getattr(spec, "stream", True))
        b.concurrency = None if spec.request_rate is not None else spec.concurrency  # for batching()
        return b

    def batching(self) -> dict[str, Any] | None:
        """A closed-loop concurrency the server says it cannot run at once: its own batch limit
        (ddtree-bench serve's /server_info `max_batch`, SGLang's `max_running_requests`) below the
        run's concurrency -> {honoured False, why}; the rest waited in its queue, so the run is not a
        measurement at that load. None otherwise: whether a server batched is not the client's to
        vouch for (`metrics.concurrency_summary` still flags a run whose requests never overlapped)."""
        info = self.info.get("server_info") or {}
        limit = info.get("max_batch", info.get("max_running_requests"))
        wanted = self.concurrency
        if not isinstance(limit, int) or isinstance(limit, bool) or wanted is None or limit >= wanted:
            return None
        key = "max_batch" if "max_batch" in info else "max_running_requests"
        runs = "one request at a time" if limit == 1 else f"at most {limit} requests at once"
        return {"max_batch": limit, "honoured": False,
                "why": f"the server runs {runs} (its /server_info {key} = {limit}), so of the {wanted} concurrent "
                       "requests the others waited in its queue"}

    # ------------------------------------------------------------------ lifecycle

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    async def _get(self, path: str, timeout_s: float) -> tuple[int, Any]:
        import aiohttp

        async with self._session.get(self.url + path, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text

    async def start(self) -> None:
        """Open the session and check the server: reachable, key accepted, which model it serves."""
        import aiohttp

        if self._session is None or self._session.closed:
            # limit=0: the driver bounds requests in flight; a pool limit would queue them in the client.
            trace = aiohttp.TraceConfig()

            async def opened(*_args) -> None:
                self.connections_opened += 1

            async def reused(_session, ctx, _params) -> None:
                if isinstance(ctx.trace_request_ctx, dict):
                    ctx.trace_request_ctx["reused"] = True

            trace.on_connection_create_end.append(opened)
            trace.on_connection_reuseconn.append(reused)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=self.kind == "llamacpp"), headers=self._headers(),
                trace_configs=[trace])
        if self.kind in ("openai", "llamacpp") and self.tokenizer is None:
            self.tokenizer = local_tokenizer(self.model)  # for re-tokenizing text; None: ids only if the server sends them
        if self.endpoint == "completions" and self.tokenizer is None:
            self.tokenizer = local_tokenizer(self.model)
            if self.tokenizer is None:
                raise UsageError(
                    f"--endpoint completions renders prompts on the client with the model's chat template, and --model {self.model!r} "
                    "is not a local model directory with tokenizer.json",
                    hint="pass --model /path/to/a/local/copy/of/the/served/model, or use --endpoint chat")
        probe = min(D.HTTP_PROBE_TIMEOUT_S, self.timeout_s)
        try:
            status, body = await self._get("/v1/models", probe)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            await self.aclose()
            reason = "no answer within %gs" % probe if isinstance(e, asyncio.TimeoutError) else (str(e) or type(e).__name__)
            raise UsageError(f"cannot reach the server at {self.url}: {reason}",
                             hint="start it (e.g. `ddtree-bench serve`) or fix --url") from None
        if status == 401:
            await self.aclose()
            raise UsageError(f"the server at {self.url} rejected the API key (401: {error_message(body)})",
                             hint="pass --api-key (or set DDTREE_BENCH_API_KEY)")
        if status == 503:
            await self.aclose()
            raise UsageError(f"the server at {self.url} is not ready (503: {error_message(body)})",
                             hint="wait until its /health answers 200")
        if status >= 500:
            await self.aclose()
            raise UsageError(f"the server at {self.url} failed its model list (GET /v1/models answered {status}: "
                             f"{' '.join(str(error_message(body) if isinstance(body, dict) else body).split())[:200]})",
                             hint="see the server's log")
        if status == 200 and not isinstance(body, dict):
            await self.aclose()
            raise UsageError(f"the server at {self.url} answered GET /v1/models with no JSON model list "
                             f"({' '.join(str(body).split())[:120]!r})", hint="is --url an OpenAI-compatible server's base URL?")
        ids = []
        if status == 200 and isinstance(body, dict) and isinstance(body.get("data"), list):
            ids = [m.get("id") for m in body["data"] if isinstance(m, dict) and isinstance(m.get("id"), str)]
        self.info["models"] = ids
        if self.model in ids or not ids:
            self.served_model = self.model
        elif len(ids) == 1:
            self.served_model = ids[0]
        else:
            await self.aclose()
            raise UsageError(f"the server at {self.url} serves {', '.join(ids)}, not {self.model!r}", hint="pass --model NAME")
        await self._server_info(probe)

    async def _server_info(self, timeout_s: float) -> None:
        """Version and flags where the server exposes them (vLLM /version, SGLang and ours /server_info)."""
        import aiohttp

        for path in ("/version", "/server_info"):
            try:
                status, body = await self._get(path, timeout_s)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                continue
            if status != 200 or not isinstance(body, dict):
                continue
            if path == "/version":
                self.info["server_version"] = body.get("version")
            elif self.kind == "sglang":
                keep = {k: v for k, v in body.items() if k in SGLANG_INFO_KEYS or k.startswith("speculative_")}
                self.info["server_info"] = keep
                self.info.setdefault("server_version", body.get("version"))
                if str(body.get("speculative_algorithm") or "").upper() == "DFLASH" and isinstance(body.get("speculative_num_draft_tokens"), int):
                    self.block_size = body["speculative_num_draft_tokens"]
            else:
                self.info["server_info"] = body
                self.info.setdefault("server_version", body.get("version"))
                if isinstance(body.get("block_size"), int):
                    self.block_size = body["block_size"]

    async def _fresh_session(self):
        """A session that never reuses connections (re-sends after a dead kept-alive connection)."""
        import aiohttp

        if self._fresh is None or self._fresh.closed:
            self._fresh = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True),
                                                headers=self._headers())
        return self._fresh

    async def aclose(self) -> None:
        for s in (self._session, self._fresh):
            if s is not None and not s.closed:
                await s.close()
        self._session = self._fresh = None

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.url, "endpoint": ENDPOINTS[self.endpoint], "model": self.model,
                "served_model": self.served_model, "block_size": self.block_size, "stop_ids": self.stop_ids,
                "timeout_s": self.timeout_s, "extra_body": self.extra_body or None, "stream": self.stream,
                "retokenize_with": str(self.tokenizer.model_dir) if self.kind == "openai" and self.tokenizer else None,
                "connections_opened": self.connections_opened,
                "stale_connection_retries": self.stale_connection_retries,
                "drafts_shortened_to_budget": self.kind == "llamacpp" or None, **self.info}

    # ------------------------------------------------------------------ requests

    def payload(self, req: GenerationRequest) -> tuple[dict[str, Any], list[int] | None]:
        """The request body for `req`, and the prompt token ids when the client rendered them.

        Standard OpenAI fields for every kind; the vendor fields only for the servers we know
        (VENDOR_KINDS), chosen per server as the module docstring says."""
        vendor = self.kind in VENDOR_KINDS
        body: dict[str, Any] = {
            "model": self.served_model or self.model,
            "stream": self.stream,
            "max_tokens": req.max_new_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p,
        }
        if self.stream:
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True} if vendor else {"include_usage": True}
        if req.seed is not None:
            body["seed"] = req.seed
        if vendor and self.stop_ids is not None:
            body["stop_token_ids"] = self.stop_ids
        prompt_ids = None
        llama = self.kind == "llamacpp"
        if self.endpoint == "chat":
            body["messages"] = req.messages
            if vendor or llama:
                body["chat_template_kwargs"] = {"enable_thinking": False}
        elif vendor or llama:
            prompt_ids = list(req.prompt_ids) if req.prompt_ids is not None else self.tokenizer.apply_chat_template(req.messages)
            body["prompt"] = prompt_ids
        else:  # the standard prompt is text: the conversation rendered by the local chat template
            text = (self.tokenizer.decode(req.prompt_ids, skip_special_tokens=False) if req.prompt_ids is not None
                    else self.tokenizer.render(req.messages))
            prompt_ids = self.tokenizer.encode(text)
            body["prompt"] = text
        if self.kind == "sglang" and self.endpoint == "chat" and self.stream:
            # serving_chat.py: 400 "return_token_ids is not supported with streaming on /v1/chat/completions"
            body["return_output_ids_in_sglext"] = True
            body["return_input_ids_in_sglext"] = True
        elif vendor:
            body["return_token_ids"] = True
        if self.kind == "sglang":
            body["return_spec_tokens_details"] = True
        if llama:
            body.update(return_tokens=True, verbose=True, timings_per_token=True, top_k=0, min_p=0.0, cache_prompt=False)
        body.update(self.extra_body)
        return body, prompt_ids

    async def generate(self, req: GenerationRequest) -> RequestRecord:
        import aiohttp

        rec = RequestRecord(prompt_id=req.prompt_id, turn=req.turn)
        state = StreamState()
        texts: list[str] = []  # the text of each counted chunk (re-tokenized counts, `_finish`)
        try:
            body, sent_ids = self.payload(req)
        except Exception as e:  # e.g. a chat template that rejects the conversation
            rec.t_send_ns = rec.t_done_ns = time.perf_counter_ns()
            rec.error = f"client: cannot build the request: {e}"
            return rec
        data = json.dumps(body).encode()
        url = self.url + ENDPOINTS[self.endpoint]
        responded = False  # response headers arrived: later breaks are truncated streams, earlier ones connection errors
        rec.t_send_ns = time.perf_counter_ns()
        ctx: dict[str, Any] = {"reused": False}  # set by the trace when the pool hands out a kept-alive connection
        for attempt in range(2):  # a second attempt only for a request whose reused connection was dead (docstring)
            try:
                if self._session is None:
                    raise RuntimeError("HTTPBackend.generate before start()")
                session = self._session if attempt == 0 else await self._fresh_session()
                async with session.post(url, data=data, timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                        trace_request_ctx=ctx) as resp:
                    responded = True
                    if resp.status != 200:
                        text = await resp.text()
                        try:
                            msg = error_message(json.loads(text))
                        except ValueError:
                            msg = text.strip()[:500] or resp.reason
                        rec.error = f"http {resp.status}: {msg}"
                    elif "json" in (resp.content_type or ""):  # a server that ignored stream=true
                        obj = json.loads(await resp.read())
                        rec.t_done_ns = time.perf_counter_ns()
                        self._account(rec, state, obj, rec.t_done_ns, texts)
                        if not self.stream:  # asked for one body: no first-token time to report (TTFT/TPOT stay unknown)
                            rec.t_first_token_ns = None
                    elif (resp.content_type or "").startswith("text/html"):  # a proxy's or a login page, not the API
                        rec.error = (f"bad response: 200 with a {resp.content_type} page, not an event stream: "
                                     f"{' '.join((await resp.text()).split())[:200]}")
                    else:
                        if not await self._read_stream(resp, rec, state, texts):
                            rec.error = (f"truncated stream: the response ended without [DONE] or a finish_reason after "
                                         f"{len(state.output_ids) or sum(rec.chunk_tokens)} tokens")
            except asyncio.TimeoutError:
                rec.error = f"timeout: no complete response within {self.timeout_s:g}s"
            except ResponseError as e:
                rec.error = f"server error: {e}"
            except aiohttp.ClientConnectorError as e:
                rec.error = f"connection: {e}"
            except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
                if not responded and attempt == 0 and ctx["reused"] and not isinstance(e, aiohttp.ClientPayloadError):
                    self.stale_connection_retries += 1  # the server had closed the kept-alive connection: never read
                    continue
                if responded:
                    rec.error = (f"truncated stream: the connection broke after {len(state.output_ids) or sum(rec.chunk_tokens)} "
                                 f"tokens ({type(e).__name__}: {e})")
                else:
                    rec.error = f"connection: {type(e).__name__}: {e}"
            except aiohttp.ClientError as e:  # ClientConnectionResetError: "Cannot write to closing transport"
                if not responded and attempt == 0 and ctx["reused"] and isinstance(e, ConnectionResetError):
                    self.stale_connection_retries += 1
                    continue
                rec.error = f"connection: {type(e).__name__}: {e}"
            except ValueError as e:  # malformed JSON in the stream
                rec.error = f"bad response: {e}"
            break
        if rec.t_done_ns is None:
            rec.t_done_ns = time.perf_counter_ns()
        self._finish(rec, state, sent_ids, texts)
        if rec.error is None:
            rec.error = response_fault(rec, req.max_new_tokens)
        elif rec.error.startswith("timeout") and rec.num_output_tokens:
            rec.error += f" ({rec.num_output_tokens} tokens had arrived)"
        return rec

    def _account(self, rec: RequestRecord, state: StreamState, obj: Any, t_ns: int, texts: list[str]) -> None:
        upd = state.feed(obj)
        if upd.num_tokens > 0:
            if rec.t_first_token_ns is None:
                rec.t_first_token_ns = t_ns
            rec.chunk_times_ns.append(t_ns)
            rec.chunk_tokens.append(upd.num_tokens)
            texts.append(upd.text)
        elif upd.text and texts:  # text in a chunk credited no token: it belongs to the last counted one
            texts[-1] += upd.text

    async def _read_stream(self, resp, rec: RequestRecord, state: StreamState, texts: list[str]) -> bool:
        """Consume SSE `data:` events; True when the stream is complete: `[DONE]` arrived, or it
        ended after a chunk with a finish_reason (servers that send no `[DONE]`). Each read is
        stamped once, on arrival; without `[DONE]` the last read is the end."""
        pending = b""
        done = False
        t_last = None

        def handle(lines: list[bytes], t: int) -> None:
            nonlocal done
            for line in lines:
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue  # blank separators, comments, event:/id: fields
                event = line[5:].strip()
                if event == b"[DONE]":
                    rec.t_done_ns = t
                    done = True
                elif not done:
                    self._account(rec, state, json.loads(event), t, texts)

        async for data in resp.content.iter_any():
            t = t_last = time.perf_counter_ns()
            lines = (pending + data).split(b"\n")
            pending = lines.pop()
            handle(lines, t)
        if pending.strip() and t_last is not None:  # a last event without its newline
            handle([pending], t_last)
        if not done and state.finish_reason is not None and t_last is not None:
            rec.t_done_ns = t_last
            return True
        return done

    def _finish(self, rec: RequestRecord, state: StreamState, sent_ids: list[int] | None, texts: list[str]) -> None:
        """Fill the record from the folded response; cross-check token counts."""
        rec.output_text = state.text
        rec.output_ids = list(state.output_ids) if state.saw_token_ids else None
        if self.kind == "llamacpp" and not rec.output_ids and state.text:  # streamed chat: llama-server sends no ids
            rec.output_ids = None
        retokenized = False
        if rec.output_ids is not None:
            rec.token_source = "server"
        elif self.kind in ("openai", "llamacpp") and self.tokenizer is not None and rec.error is None:
            rec.output_ids = self.tokenizer.encode(state.text)
            rec.token_source = "retokenized"
            if state.token_count_source == "text-chunks":  # exact per-chunk counts (usage) are kept
                retokenized = self._recount_chunks(rec, texts)
        rec.prompt_ids = state.prompt_ids if state.prompt_ids is not None else sent_ids
        n_usage = state.usage_completion_tokens
        rec.num_prompt_tokens = state.usage_prompt_tokens if state.usage_prompt_tokens is not None else (
            len(rec.prompt_ids) if rec.prompt_ids is not None else None)
        if n_usage is not None:
            rec.num_output_tokens = n_usage
        elif rec.output_ids is not None:
            rec.num_output_tokens = len(rec.output_ids)
        elif rec.chunk_tokens:
            rec.num_output_tokens = sum(rec.chunk_tokens)
        rec.finish_reason = state.finish_reason
        stats = dict(state.stats) if state.stats else {}
        if state.stats:
            rec.accept_lengths, rec.accept_lengths_source = accept_lengths_from_stats(state.stats)
            k = state.stats.get("num_spec_tokens")
            if isinstance(k, int) and k + 1 > self.block_size:
                self.block_size = k + 1
        if retokenized:
            stats["chunk_token_counts_from"] = "retokenized-text"
        elif state.token_count_source not in (None, "token_ids"):
            stats["chunk_token_counts_from"] = state.token_count_source
        if n_usage is not None and rec.output_ids is not None and n_usage != len(rec.output_ids):
            stats["token_count_mismatch"] = {"usage_completion_tokens": n_usage, "token_ids": len(rec.output_ids)}
        rec.server_stats = stats or None

    def _recount_chunks(self, rec: RequestRecord, texts: list[str]) -> bool:
        """Re-count a text-only stream's chunks in tokens of the re-tokenized output: chunk i carries
        len(encode(text of chunks 0..i)) - the tokens credited before it (capped at the total; the
        rest goes to the last chunk). Chunks left with 0 tokens (the start of a token split over
        chunks) are dropped, their text counted with the next. False when there is nothing to
        re-count (one body, or counts not from text)."""
        if len(texts) != len(rec.chunk_tokens) or len(texts) < 2:
            return False
        total = len(rec.output_ids or [])
        counts, prefix, credited = [], "", 0
        for t in texts:
            prefix += t
            n = min(len(self.tokenizer.encode(prefix)), total)
            counts.append(max(0, n - credited))
            credited = max(credited, n)
        counts[-1] += total - credited
        keep = [i for i, c in enumerate(counts) if c > 0]
        rec.chunk_times_ns = [rec.chunk_times_ns[i] for i in keep]
        rec.chunk_tokens = [counts[i] for i in keep]
        if keep:
            rec.t_first_token_ns = rec.chunk_times_ns[0]
        return True


def _bad_ids(ids: Any) -> Any:
    """The first entry of a token id list that is no token id (not a non-negative int), else None."""
    if ids is None:
        return None
    return next((t for t in ids if not isinstance(t, int) or isinstance(t, bool) or t < 0), None)


def response_fault(rec: RequestRecord, max_new_tokens: int) -> str | None:
    """What makes a complete-looking response no answer (a request error, `bad response: ...`), else None: token ids
    that are not token ids (the ids are dropped: they describe nothing), no token and no finish_reason (a bare
    `[DONE]`), more tokens than max_tokens."""
    for what in ("output_ids", "prompt_ids"):
        bad = _bad_ids(getattr(rec, what))
        if bad is not None:
            rec.output_ids = rec.prompt_ids = None
            return f"bad response: the server's {what.replace('_', ' ')} hold {bad!r}, not a token id"
    if not rec.num_output_tokens and not rec.output_text and rec.finish_reason is None:
        return "bad response: the server sent no token and no finish_reason"
    if rec.num_output_tokens is not None and rec.num_output_tokens > max_new_tokens:
        return f"bad response: {rec.num_output_tokens} tokens for max_tokens {max_new_tokens}"
    return None


def probe_server_info(url: str, api_key: str | None = None, timeout_s: float = D.HTTP_PROBE_TIMEOUT_S) -> dict[str, Any] | None:
    """The server's GET /server_info as a dict: {} where it answered without one (no such route, not a JSON object);
    None where it did not answer at all."""
    import requests

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = requests.get(normalize_url(url) + "/server_info", headers=headers, timeout=timeout_s)
    except requests.RequestException:
        return None
    try:
        body = resp.json() if resp.status_code == 200 else None
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def server_method(backend: str, info: dict[str, Any]) -> tuple[str | None, int | None]:
    """(method, budget) a server's /server_info reports, (None, None) where it says nothing we can read:
    ddtree-bench serve names `method` (and `budget`); SGLang names `speculative_algorithm` (None: plain AR;
    DFLASH: dflash; DDTREE: ddtree, budget unknown); vLLM, llama.cpp and transformers serve have no such route."""
    if backend == "sglang":
        if "speculative_algorithm" not in info:
            return None, None
        alg = str(info.get("speculative_algorithm") or "").upper()
        return {"": "ar", "NONE": "ar", "DFLASH": "dflash", "DDTREE": "ddtree"}.get(alg), None
    method = info.get("method")
    if method not in D.METHODS:
        return None, None
    budget = info.get("budget") if method == "ddtree" else None
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool)):
        budget = None
    return method, budget


def _check_served_model(spec, info: dict[str, Any]) -> None:
    """A --model that is on this machine and whose weights' hash is not the one the server's /server_info reports
    (ddtree-bench serve does) is bad input: the run would be labelled with a model the server does not run."""
    theirs = info.get("model_hash")
    if not isinstance(theirs, str) or not theirs:
        return
    from ddtree_bench.pair import model_dirs

    try:
        target_dir, _ = model_dirs(spec.model, None)
    except UsageError:
        return
    if target_dir is not None and not (Path(target_dir) / "config.json").exists():
        return
    from ddtree_bench.engine.loading import dir_hash

    mine = "random-seed-0" if target_dir is None else dir_hash(target_dir)   # `random`: pair.py's hash for it
    if mine != theirs:
        raise UsageError(f"--model {spec.model} ({mine}) is not the model the server at {normalize_url(spec.url)} runs "
                         f"({info.get('model') or '?'}, {theirs})", hint="pass the server's --model, or point --url at its server")


def adopt_server_labels(spec, flags_given: tuple[str, ...] | list[str] | set[str] = ()) -> Any:
    """The run's method and budget labels from the server itself, where it reports them.

    An HTTP client cannot choose what the server runs: `ddtree-bench serve --budget 32` runs B = 32
    whatever `run --budget` says. So when the server's /server_info names its method (`server_method`:
    ddtree-bench serve and SGLang do; vLLM, llama.cpp and transformers serve do not) the run is labelled
    with it (and `spec.extra["labels_from"]` records it). A flag the user gave (`flags_given` holds
    "method" / "budget") that contradicts the server is an error (exit 2): the user meant another server.
    Flags left at their defaults simply yield. Where the server says nothing and --method was not given,
    a note says the label is the --method default and `labels_from` records that (explain warns on it).
    Returns `spec` (changed in place); unchanged when the server cannot be reached (the first request then
    reports that).
    """
    if spec.backend == "inprocess" or not spec.url:
        return spec
    info = probe_server_info(spec.url, spec.api_key)
    if info is None:   # not reachable: the first request says so, not a note about labels
        return spec
    _check_served_model(spec, info)
    method, budget = server_method(spec.backend, info)
    if method is None:
        if "method" not in flags_given:
            label = method_label(spec.method, spec.budget)
            alg = info.get("speculative_algorithm") if spec.backend == "sglang" else None
            what = (f"the server runs speculative algorithm {alg}, which is none of ar / dflash / ddtree" if alg else
                    "the server does not say what it runs")
            why = ("" if spec.backend in ("openai", "standalone") or alg else
                   f" (a {spec.backend} server does not report it; neither vLLM nor SGLang ships DDTree: a DFlash "
                   "deployment is --method dflash)")
            print(f"note: {what}; the run is labelled {label} (the --method default){why}; "
                  "pass --method to label it", file=sys.stderr)
            spec.extra = {**spec.extra, "labels_from": {"source": "--method default (the server does not say)",
                                                        "method": spec.method, "budget": spec.budget}}
        return spec
    label = method_label(method, budget)
    conflicts = []
    if "method" in flags_given and spec.method != method:
        conflicts.append(f"--method {spec.method}")
    if "budget" in flags_given and method == "ddtree" and budget is not None and spec.budget != budget:
        conflicts.append(f"--budget {spec.budget}")
    if conflicts:
        raise UsageError(f"{' and '.join(conflicts)} contradict{'s' if len(conflicts) == 1 else ''} the server at "
                         f"{normalize_url(spec.url)}, which runs {label} (its /server_info)",
                         hint="leave the flag out (the run is labelled from the server) or restart the server with it")
    if spec.method != method or (budget is not None and spec.budget != budget):
        print(f"note: the server at {normalize_url(spec.url)} runs {label} (its /server_info); the run is labelled so",
              file=sys.stderr)
    spec.method = method
    if budget is not None:
        spec.budget = budget
    spec.extra = {**spec.extra, "labels_from": {"source": "server /server_info", "method": method, "budget": budget}}
    return spec
