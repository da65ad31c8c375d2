"""The OpenAI-compatible streaming HTTP client: one backend for `standalone` (ddtree-bench serve),
`sglang` and `vllm` servers.

Every request streams (`stream: true`, `stream_options.include_usage` and `continuous_usage_stats`)
from `/v1/chat/completions` (messages; the server renders its chat template, with
`chat_template_kwargs.enable_thinking = false` as the in-process engine renders it) or
`/v1/completions` (the conversation rendered into token ids on the client with the model's local
tokenizer, the exact-parity path). Sampling is always explicit: `temperature`, `top_p`,
`max_tokens`, `seed`, plus `return_token_ids` so outputs compare as ids; SGLang also gets
`return_spec_tokens_details`. One `aiohttp.ClientSession` (one keep-alive pool) serves the whole
run. Each SSE read is stamped with `time.perf_counter_ns()`; a chunk's token count comes from its
token ids (see `parsers`), so a k-token speculative chunk is k tokens for ITL.

Failures of one request become its `error` ("timeout: ...", "http 503: <server message>",
"connection: ...", "truncated stream: ...", "server error: ..."); an unreachable server at `start()`
raises `UsageError` naming the URL. `describe()` records the served model ids and what the server
says about itself (`/version`, `/server_info`).

Knows HTTP and response shapes (through `parsers`); nothing of trees, suites or metrics.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ddtree_bench import defaults as D
from ddtree_bench.backends.parsers import ResponseError, StreamState, accept_lengths_from_stats, error_message
from ddtree_bench.errors import UsageError
from ddtree_bench.records import GenerationRequest, RequestRecord

KINDS = ("standalone", "sglang", "vllm")
ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
# What run.json keeps of SGLang's (large) /server_info.
SGLANG_INFO_KEYS = ("version", "model_path", "served_model_name", "dtype", "tp_size", "dp_size", "attention_backend",
                    "max_running_requests", "enable_deterministic_inference", "sampling_defaults", "launch_command")


def normalize_url(url: str) -> str:
    """'http://h:p/' or 'http://h:p/v1' -> 'http://h:p'. Raises UsageError for anything that is not http(s)://host."""
    u = url.strip().rstrip("/")
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
    if model == "toy":
        from ddtree_bench.pair import TOY_DIR

        path = TOY_DIR / "target"
    else:
        path = Path(model).expanduser()
    return ChatTokenizer(path) if (path / "tokenizer.json").exists() else None


class HTTPBackend:
    """Drives one OpenAI-compatible server. Create with `from_spec`; `drive` calls start/aclose."""

    def __init__(self, kind: str, url: str, *, model: str, endpoint: str = "chat", api_key: str | None = None,
                 timeout_s: float = D.REQUEST_TIMEOUT_S, stop_ids: list[int] | None = None,
                 extra_body: dict[str, Any] | None = None):
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
        self.served_model: str | None = None
        self.block_size = 16
        self.info: dict[str, Any] = {}
        self.tokenizer = None
        self.connections_opened = 0  # TCP connections the pool opened (keep-alive: about one per concurrent request)
        self._session = None

    @classmethod
    def from_spec(cls, spec) -> "HTTPBackend":
        if not spec.url:
            raise UsageError(f"--backend {spec.backend} needs --url (the server's base URL)")
        return cls(spec.backend, spec.url, model=spec.model, endpoint=spec.endpoint, api_key=spec.api_key,
                   timeout_s=spec.timeout_s, stop_ids=spec.stop_ids, extra_body=spec.extra.get("extra_body"))

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

            trace.on_connection_create_end.append(opened)
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), headers=self._headers(),
                                                  trace_configs=[trace])
        if self.endpoint == "completions" and self.tokenizer is None:
            self.tokenizer = local_tokenizer(self.model)
            if self.tokenizer is None:
                raise UsageError(
                    f"--endpoint completions renders prompts into token ids on the client, and --model {self.model!r} "
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

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.url, "endpoint": ENDPOINTS[self.endpoint], "model": self.model,
                "served_model": self.served_model, "block_size": self.block_size, "stop_ids": self.stop_ids,
                "timeout_s": self.timeout_s, "extra_body": self.extra_body or None,
                "connections_opened": self.connections_opened, **self.info}

    # ------------------------------------------------------------------ requests

    def payload(self, req: GenerationRequest) -> tuple[dict[str, Any], list[int] | None]:
        """The request body for `req`, and the prompt token ids when the client rendered them."""
        body: dict[str, Any] = {
            "model": self.served_model or self.model,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "max_tokens": req.max_new_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "return_token_ids": True,
        }
        if req.seed is not None:
            body["seed"] = req.seed
        if self.stop_ids is not None:
            body["stop_token_ids"] = self.stop_ids
        prompt_ids = None
        if self.endpoint == "chat":
            body["messages"] = req.messages
            body["chat_template_kwargs"] = {"enable_thinking": False}
        else:
            prompt_ids = list(req.prompt_ids) if req.prompt_ids is not None else self.tokenizer.apply_chat_template(req.messages)
            body["prompt"] = prompt_ids
        if self.kind == "sglang":
            body["return_spec_tokens_details"] = True
        body.update(self.extra_body)
        return body, prompt_ids

    async def generate(self, req: GenerationRequest) -> RequestRecord:
        import aiohttp

        rec = RequestRecord(prompt_id=req.prompt_id, turn=req.turn)
        state = StreamState()
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
        try:
            if self._session is None:
                raise RuntimeError("HTTPBackend.generate before start()")
            async with self._session.post(url, data=data, timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as resp:
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
                    self._account(rec, state, obj, rec.t_done_ns)
                else:
                    if not await self._read_stream(resp, rec, state):
                        rec.error = (f"truncated stream: the response ended without [DONE] after "
                                     f"{len(state.output_ids) or sum(rec.chunk_tokens)} tokens")
        except asyncio.TimeoutError:
            rec.error = f"timeout: no complete response within {self.timeout_s:g}s"
        except ResponseError as e:
            rec.error = f"server error: {e}"
        except aiohttp.ClientConnectorError as e:
            rec.error = f"connection: {e}"
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
            if responded:
                rec.error = (f"truncated stream: the connection broke after {len(state.output_ids) or sum(rec.chunk_tokens)} "
                             f"tokens ({type(e).__name__}: {e})")
            else:
                rec.error = f"connection: {type(e).__name__}: {e}"
        except aiohttp.ClientError as e:
            rec.error = f"connection: {type(e).__name__}: {e}"
        except ValueError as e:  # malformed JSON in the stream
            rec.error = f"bad response: {e}"
        if rec.t_done_ns is None:
            rec.t_done_ns = time.perf_counter_ns()
        self._finish(rec, state, sent_ids)
        return rec

    def _account(self, rec: RequestRecord, state: StreamState, obj: Any, t_ns: int) -> None:
        upd = state.feed(obj)
        if upd.num_tokens > 0:
            if rec.t_first_token_ns is None:
                rec.t_first_token_ns = t_ns
            rec.chunk_times_ns.append(t_ns)
            rec.chunk_tokens.append(upd.num_tokens)

    async def _read_stream(self, resp, rec: RequestRecord, state: StreamState) -> bool:
        """Consume SSE `data:` events; True when `[DONE]` arrived. Each read is stamped once, on arrival."""
        pending = b""
        finished = False
        async for data in resp.content.iter_any():
            t = time.perf_counter_ns()
            lines = (pending + data).split(b"\n")
            pending = lines.pop()
            for line in lines:
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue  # blank separators, comments, event:/id: fields
                event = line[5:].strip()
                if event == b"[DONE]":
                    rec.t_done_ns = t
                    finished = True
                    continue
                if not finished:
                    self._account(rec, state, json.loads(event), t)
        return finished

    def _finish(self, rec: RequestRecord, state: StreamState, sent_ids: list[int] | None) -> None:
        """Fill the record from the folded response; cross-check token counts."""
        rec.output_text = state.text
        rec.output_ids = list(state.output_ids) if state.saw_token_ids else None
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
        if state.token_count_source not in (None, "token_ids"):
            stats["chunk_token_counts_from"] = state.token_count_source
        if n_usage is not None and rec.output_ids is not None and n_usage != len(rec.output_ids):
            stats["token_count_mismatch"] = {"usage_completion_tokens": n_usage, "token_ids": len(rec.output_ids)}
        rec.server_stats = stats or None
