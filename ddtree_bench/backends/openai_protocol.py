"""The OpenAI-compatible wire format of `ddtree-bench serve`: request validation and response shapes.

`decode_body(raw)` turns the raw body into JSON values, refusing (400) what is not strict JSON:
invalid UTF-8, `NaN` / `Infinity`, nesting deeper than `D.SERVE_MAX_JSON_DEPTH`, and strings
holding lone UTF-16 surrogates (`"\\ud800"`, which no tokenizer can encode). `parse_request(obj,
kind, ...)` turns a decoded body into a `ServeRequest` or raises `ApiError` with the HTTP status
and a message that names the offending field (400), the unknown model (404, as OpenAI and vLLM
answer) or an unsupported feature (400).

Every scalar field's JSON type and range is checked in one place, the table `FIELDS` (field ->
`Field`): integers are JSON integers (not `true`, not `5.0`) inside int64 or a tighter range,
numbers are finite and in range, booleans are `true`/`false`. A field we do not implement (`n`,
`prompt_logprobs`, penalties, `top_k`, ...) has `off` values: those (or `null`) are accepted, anything
else is 400 "not supported", so a request never silently decodes differently than it asked.
Unknown fields are ignored, as vLLM and SGLang do. `stream_options` follow vLLM: only with
`stream: true`, and `continuous_usage_stats` only together with `include_usage`.

The response builders produce the shapes vLLM uses, so one client reads every engine:
completions `choices[].text`, chat `choices[].delta|message`, `token_ids` per choice (deltas when
streaming), `prompt_token_ids` (in the choice for completions, top level for chat), `usage`, and
`metrics.speculative_decoding` (vLLM's per-request spec metrics) extended with our exact
per-round `acceptance_lengths`, and `logprobs` per choice when asked (`LogprobsText`: chat
`logprobs: true` + `top_logprobs: k`, completions `logprobs: k`, k <= LOGPROBS_MAX).

Knows JSON shapes; nothing of models, sockets or timing.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ddtree_bench import defaults as D

INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1
_SURROGATE = re.compile("[\\ud800-\\udfff]")


class ApiError(Exception):
    """A request the server refuses: HTTP `status`, OpenAI error `type`, the offending `param`."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.type, self.param)


def error_body(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": status}}


# ---------------------------------------------------------------------------- decoding


def _reject_constant(name: str) -> Any:
    raise ApiError(400, f"the request body is not valid JSON: {name} is not a JSON number (numbers must be finite)")


def decode_body(raw: bytes, max_depth: int = D.SERVE_MAX_JSON_DEPTH) -> Any:
    """Strict JSON of a request body (see the module docstring), or `ApiError` 400."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the request body is not valid UTF-8 (byte {e.start}: {raw[e.start:e.start + 1]!r})") from None
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ApiError(400, f"the request body nests deeper than {max_depth} levels") from None
    except ValueError as e:  # JSONDecodeError
        raise ApiError(400, f"the request body is not valid JSON ({e})") from None
    _check_tree(obj, max_depth)
    return obj


def _check_tree(obj: Any, max_depth: int) -> None:
    """Depth <= max_depth and no lone surrogate in any string (keys too); iterative, O(size)."""
    stack: list[tuple[Any, int, str]] = [(obj, 1, "")]
    while stack:
        v, depth, where = stack.pop()
        if isinstance(v, str):
            m = _SURROGATE.search(v)
            if m:
                raise ApiError(400, f"invalid unicode in the request body{where}: a lone surrogate "
                               f"\\u{ord(m.group()):04x} (not a character; send UTF-8 text)", param=where.strip(" ()") or None)
            continue
        if not isinstance(v, (dict, list)):
            continue
        if depth > max_depth:
            raise ApiError(400, f"the request body nests deeper than {max_depth} levels")
        if isinstance(v, dict):
            for k, x in v.items():
                path = f" ({k})" if depth == 1 else where
                stack.append((k, depth, path))
                stack.append((x, depth + 1, path))
        else:
            stack.extend((x, depth + 1, where) for x in v)


# ---------------------------------------------------------------------------- the field table


@dataclass(frozen=True)
class Field:
    """A scalar body field: its JSON kinds ("int", "number", "bool", "str", "object"), its range
    (`lo`..`hi`, `lo` excluded when `lo_open`) and, for a feature we do not implement, the values
    that mean "off" (anything else is 400 `why`)."""

    kinds: tuple[str, ...]
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    off: tuple[Any, ...] = ()
    why: str = ""


def _f(*kinds: str, **kw: Any) -> Field:
    return Field(kinds, **kw)


LOGPROBS_MAX = 20  # vLLM's default --max-logprobs; more is a 400
FIELDS: dict[str, Field] = {
    "model": _f("str"),
    "max_tokens": _f("int", lo=1, hi=INT64_MAX),
    "max_completion_tokens": _f("int", lo=1, hi=INT64_MAX),
    "temperature": _f("number", lo=0, hi=2),                     # OpenAI's range
    "top_p": _f("number", lo=0, hi=1, lo_open=True),
    "seed": _f("int", lo=INT64_MIN, hi=INT64_MAX),               # vLLM: torch.long
    "stream": _f("bool"),
    "stream_options": _f("object"),
    "ignore_eos": _f("bool"),
    "return_token_ids": _f("bool"),
    "chat_template_kwargs": _f("object"),
    "user": _f("str"),
    # accepted only when off
    "n": _f("int", lo=1, hi=INT64_MAX, off=(1,), why="only n = 1 is supported"),
    "best_of": _f("int", lo=1, hi=INT64_MAX, off=(1,), why="best_of is not supported"),
    "logprobs": _f("bool", "int", lo=0, hi=LOGPROBS_MAX),          # chat: bool, completions: int (parse_request)
    "top_logprobs": _f("int", lo=0, hi=LOGPROBS_MAX),              # chat only; ignored by completions, as vLLM
    "prompt_logprobs": _f("int", lo=0, hi=20, off=(0,), why="prompt_logprobs are not supported"),
    "echo": _f("bool", off=(False,), why="echo is not supported"),
    "suffix": _f("str", off=("",), why="suffix is not supported"),
    "frequency_penalty": _f("number", lo=-2, hi=2, off=(0,), why="frequency_penalty is not supported"),
    "presence_penalty": _f("number", lo=-2, hi=2, off=(0,), why="presence_penalty is not supported"),
    "repetition_penalty": _f("number", lo=0, hi=INT64_MAX, lo_open=True, off=(1,), why="repetition_penalty is not supported"),
    "top_k": _f("int", lo=-1, hi=INT64_MAX, off=(-1, 0), why="top_k is not supported"),
    "min_p": _f("number", lo=0, hi=1, off=(0,), why="min_p is not supported"),
}
STREAM_OPTIONS: dict[str, Field] = {"include_usage": _f("bool"), "continuous_usage_stats": _f("bool")}
CHAT_TEMPLATE_KWARGS: dict[str, Field] = {"enable_thinking": _f("bool")}
KIND_NAMES = {"int": "an integer", "number": "a number", "bool": "a boolean", "str": "a string", "object": "an object"}


def _kind(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "number"
    return {str: "str", dict: "object", list: "list"}.get(type(v), type(v).__name__)


def _show(v: Any) -> str:
    """A short, safe rendering of a JSON value for an error message (containers by kind only)."""
    if isinstance(v, (dict, list)):
        return "an object" if isinstance(v, dict) else "a list"
    text = json.dumps(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _bound(x: float) -> str:
    return {INT64_MAX: "2^63 - 1", INT64_MIN: "-2^63"}.get(x, f"{x:g}" if isinstance(x, float) else str(x))


def _range_text(f: Field) -> str:
    if (f.lo, f.hi) == (INT64_MIN, INT64_MAX):
        return "a 64-bit signed integer"
    if f.hi == INT64_MAX and "number" in f.kinds:
        return f"> {_bound(f.lo)}" if f.lo_open else f">= {_bound(f.lo)}"
    if f.hi == INT64_MAX:   # an integer field: name the 64-bit ceiling too (2^63 is a 400 as well)
        return f"an integer {'>' if f.lo_open else '>='} {_bound(f.lo)} and <= 2^63 - 1"
    return f"in {'(' if f.lo_open else '['}{_bound(f.lo)}, {_bound(f.hi)}]"


def check_field(obj: dict[str, Any], key: str, table: dict[str, Field] = FIELDS, where: str = "") -> Any:
    """The value of `obj[key]` checked against `table[key]`, or None when absent or null."""
    f, v = table[key], obj.get(key)
    name = f"{where}{key}"
    if v is None:
        return None
    kind = _kind(v)
    ok_kind = kind in f.kinds or (kind == "int" and "number" in f.kinds)
    if not ok_kind:
        what = " or ".join(KIND_NAMES[k] for k in f.kinds)
        raise ApiError(400, f"'{name}' must be {what}, got {_show(v)}", param=name)
    if kind in ("int", "number") and f.lo is not None:
        x = float(v) if kind == "number" else v
        if (kind == "number" and not math.isfinite(x)) or x < f.lo or x > f.hi or (f.lo_open and x == f.lo):
            raise ApiError(400, f"'{name}' must be {_range_text(f)}, got {_show(v)}", param=name)
    if f.off and not any(v == o and (type(v) is type(o) or _kind(o) in ("int", "number") and kind in ("int", "number"))
                         for o in f.off):
        raise ApiError(400, f.why, param=name)
    return v


@dataclass
class ServeRequest:
    """A validated generation request (one prompt, n = 1)."""

    kind: str                                 # "chat" | "completions"
    model: str
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    return_token_ids: bool = False
    stop_token_ids: list[int] | None = None   # None = the model's stop ids
    logprobs: int | None = None               # None: no logprobs; k: each token's and the top k (0..LOGPROBS_MAX)
    ignore_eos: bool = False
    enable_thinking: bool = False
    prompt_text: str | None = None            # completions
    prompt_ids: list[int] | None = None       # completions
    messages: list[dict[str, str]] | None = None  # chat
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _token_list(v: Any, vocab_size: int, key: str) -> list[int]:
    bad = next((t for t in v if not _is_int(t)), None) if isinstance(v, list) else v
    if not isinstance(v, list) or bad is not None:
        raise ApiError(400, f"'{key}' must be a list of integer token ids, got {_show(bad)} in it"
                       if isinstance(v, list) else f"'{key}' must be a list of integer token ids, got {_show(v)}", param=key)
    bad = next((t for t in v if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ApiError(400, f"'{key}' has token id {_show(bad)}, outside the vocabulary [0, {vocab_size})", param=key)
    return list(v)


def _message_content(m: dict[str, Any], i: int) -> str:
    c = m.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for p in c:
            if not (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)):
                raise ApiError(400, f"'messages[{i}].content' parts must be {{\"type\": \"text\", \"text\": str}} (no images or audio)",
                               param="messages")
            parts.append(p["text"])
        return "".join(parts)
    if c is None and m.get("role") == "assistant":
        return ""
    raise ApiError(400, f"'messages[{i}].content' must be a string or a list of text parts, got {_show(c)}", param="messages")


UNSUPPORTED_SHAPES = {  # non-scalar fields we do not implement: (values that mean "off", message)
    "tools": ((None, []), "tools are not supported"),
    "stop": ((None, [], ""), "stop strings are not supported; use stop_token_ids"),
    "logit_bias": ((None, {}), "logit_bias is not supported"),
    "response_format": ((None, {"type": "text"}), "response_format other than {\"type\": \"text\"} is not supported"),
}


def _logprobs(obj: dict[str, Any], kind: str) -> int | None:
    """How many top log-probabilities a request asks for per token (None: no logprobs). Chat:
    `logprobs: true` and `top_logprobs: k` (k > 0 needs `logprobs: true`, as vLLM); completions:
    `logprobs: k` (0 = the chosen token's only). Ranges were checked in FIELDS."""
    lp, top = obj.get("logprobs"), obj.get("top_logprobs")
    if kind == "chat":
        if lp is not None and not isinstance(lp, bool):
            raise ApiError(400, "'logprobs' must be a boolean on /v1/chat/completions (ask for alternatives with "
                           "'top_logprobs': k)", param="logprobs")
        if top and lp is not True:
            raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        return int(top or 0) if lp else None
    if isinstance(lp, bool):
        raise ApiError(400, "'logprobs' must be an integer on /v1/completions (the number of alternatives, "
                       f"0-{LOGPROBS_MAX})", param="logprobs")
    return lp


def parse_request(obj: Any, kind: str, served_model: str, vocab_size: int) -> ServeRequest:
    """Validate a decoded request body for `kind` ("chat" | "completions")."""
    if not isinstance(obj, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {_show(obj)}")
    for key in FIELDS:  # every scalar field's type and range, once
        check_field(obj, key)
    model = obj.get("model") or served_model
    if model != served_model:
        raise ApiError(404, f"the model '{model}' does not exist; this server serves '{served_model}'",
                       type_="NotFoundError", param="model")
    for key, (off, why) in UNSUPPORTED_SHAPES.items():
        if key in obj and not any(obj[key] == v and type(obj[key]) is type(v) for v in off):
            raise ApiError(400, why, param=key)

    if kind == "chat":
        key = "max_completion_tokens" if obj.get("max_completion_tokens") is not None else "max_tokens"
        default_max = D.MAX_NEW_TOKENS
    else:
        key, default_max = "max_tokens", D.SERVE_COMPLETIONS_MAX_TOKENS
    max_tokens = obj.get(key)
    if max_tokens is None:
        max_tokens = default_max
    temperature = obj.get("temperature")
    top_p = obj.get("top_p")
    stream = obj.get("stream") is True
    so = obj.get("stream_options") or {}
    if so and not stream:  # vLLM: "Stream options can only be defined when `stream=True`."
        raise ApiError(400, "'stream_options' can only be given with 'stream': true", param="stream_options")
    for k in STREAM_OPTIONS:
        check_field(so, k, STREAM_OPTIONS, "stream_options.")
    include_usage = so.get("include_usage") is True
    continuous = so.get("continuous_usage_stats") is True
    if continuous and not include_usage:  # as vLLM refuses it (issue 15)
        raise ApiError(400, "'stream_options.continuous_usage_stats' requires 'stream_options.include_usage': true",
                       param="stream_options")
    stop_ids = obj.get("stop_token_ids")
    if stop_ids is not None:
        stop_ids = _token_list(stop_ids, vocab_size, "stop_token_ids")
    ctk = obj.get("chat_template_kwargs") or {}
    check_field(ctk, "enable_thinking", CHAT_TEMPLATE_KWARGS, "chat_template_kwargs.")

    req = ServeRequest(kind=kind, model=served_model, max_tokens=max_tokens, logprobs=_logprobs(obj, kind),
                       temperature=1.0 if temperature is None else float(temperature),
                       top_p=1.0 if top_p is None else float(top_p), seed=obj.get("seed"), stream=stream,
                       include_usage=include_usage, continuous_usage=continuous,
                       return_token_ids=obj.get("return_token_ids") is True, stop_token_ids=stop_ids,
                       ignore_eos=obj.get("ignore_eos") is True, enable_thinking=ctk.get("enable_thinking") is True)
    if kind == "chat":
        msgs = obj.get("messages")
        if msgs is None:
            raise ApiError(400, "'messages' is required", param="messages")
        if not isinstance(msgs, list) or not msgs:
            raise ApiError(400, "'messages' must be a non-empty list of {\"role\", \"content\"} objects", param="messages")
        out = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ApiError(400, f"'messages[{i}]' must be an object with a string 'role'", param="messages")
            if m["role"] not in ("system", "user", "assistant", "developer"):
                raise ApiError(400, f"'messages[{i}].role' {_show(m['role'])} is not supported (system, developer, user, assistant)", param="messages")
            if m.get("name") is not None and not isinstance(m["name"], str):
                raise ApiError(400, f"'messages[{i}].name' must be a string, got {_show(m['name'])}", param="messages")
            out.append({"role": m["role"], "content": _message_content(m, i)})
        req.messages = out
    else:
        prompt = obj.get("prompt")
        if prompt is None:
            raise ApiError(400, "'prompt' is required", param="prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            if not prompt:
                raise ApiError(400, "'prompt' is empty", param="prompt")
            req.prompt_text = prompt
        elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
            req.prompt_ids = _token_list(prompt, vocab_size, "prompt")
        elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
            raise ApiError(400, "batched prompts are not supported; send one prompt per request", param="prompt")
        else:
            raise ApiError(400, "'prompt' must be a non-empty string or a non-empty list of token ids", param="prompt")
    return req


# ---------------------------------------------------------------------------- responses


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def spec_decoding_metrics(method: str, accept_lengths: list[int], block_size: int, budget: int) -> dict[str, Any]:
    """vLLM's `metrics.speculative_decoding` for one request, plus our exact rounds.

    num_spec_steps = verify rounds R; num_accepted_draft_tokens = sum(a_r - 1);
    num_draft_tokens = R x tree nodes per round (DDTree: budget; DFlash: block_size - 1; AR: 0);
    mean_acceptance_length = 1 + accepted / R = mean a_r; draft_acceptance_rate = accepted / drafted;
    acceptance_histogram[j] = rounds that accepted exactly j drafts, j = 0..block_size-1.

    The two ratios are floats, as in vLLM's schema; a ratio whose denominator is 0 (no rounds; no
    drafts, e.g. AR) is left out of the object, never sent as null (so is `tree_budget` off DDTree).
    """
    rounds = len(accept_lengths)
    accepted = sum(a - 1 for a in accept_lengths)
    per_round = {"ddtree": budget, "dflash": block_size - 1}.get(method, 0)
    drafted = rounds * per_round
    width = max([block_size] + list(accept_lengths))
    hist = [0] * width
    for a in accept_lengths:
        hist[a - 1] += 1
    out: dict[str, Any] = {"method": method}
    if rounds:
        out["mean_acceptance_length"] = float(1 + accepted / rounds)
    if drafted:
        out["draft_acceptance_rate"] = float(accepted / drafted)
    return out | {
        "acceptance_histogram": hist,
        "num_spec_steps": rounds,
        "num_draft_tokens": drafted,
        "num_accepted_draft_tokens": accepted,
        "num_spec_tokens": block_size - 1,
        "acceptance_lengths": list(accept_lengths),
    } | ({"tree_budget": budget} if method == "ddtree" else {})


def _finite(lp: float) -> float:
    """A log-probability JSON can carry: -inf (a token of probability 0) as vLLM sends it, -9999.0."""
    return max(float(lp), -9999.0)


class LogprobsText:
    """The `logprobs` object of a choice, in the endpoint's shape (vLLM's and OpenAI's), for one
    request's tokens as they come (streaming keeps one across chunks: completions' text offsets run on).

    chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"} x k]}]};
    completions: {"text_offset", "token_logprobs", "tokens", "top_logprobs": [{token: logprob} (the top k
    and the chosen token)]}. A token's text is `token_text(id)` (the tokenizer's text of that one id,
    special tokens included); `bytes` its UTF-8 bytes; text offsets count characters of those texts."""

    def __init__(self, kind: str, token_text):
        self.kind, self.token_text, self.offset = kind, token_text, 0

    def _entry(self, tid: int, lp: float) -> dict[str, Any]:
        t = self.token_text(tid)
        return {"token": t, "logprob": _finite(lp), "bytes": list(t.encode("utf-8", "replace"))}

    def body(self, entries: list[Any] | None) -> dict[str, Any] | None:
        """`entries`: serve_engine.TokenLogprobs (token_id, logprob, top [(id, logprob)]); None -> None."""
        if entries is None:
            return None
        if self.kind == "chat":
            return {"content": [{**self._entry(e.token_id, e.logprob), "top_logprobs": [self._entry(i, v) for i, v in e.top]}
                                for e in entries]}
        out: dict[str, Any] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
        for e in entries:
            t = self.token_text(e.token_id)
            out["text_offset"].append(self.offset)
            out["token_logprobs"].append(_finite(e.logprob))
            out["tokens"].append(t)
            tops = {self.token_text(i): _finite(v) for i, v in e.top}
            tops.setdefault(t, _finite(e.logprob))
            out["top_logprobs"].append(tops)
            self.offset += len(t)
        return out


def stream_chunk(req: ServeRequest, text: str, token_ids: list[int] | None, *, finish_reason: str | None = None,
                 first: bool = False, prompt_ids: list[int] | None = None,
                 usage_now: dict[str, int] | None = None, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    """One SSE chunk carrying `text` / `token_ids` (the delta since the previous chunk) and their
    `logprobs` (a LogprobsText body, when asked)."""
    if req.kind == "chat":
        delta: dict[str, Any] = {"content": text}
        if first:
            delta["role"] = "assistant"
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        obj_type = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        obj_type = "text_completion"
    if req.return_token_ids:
        choice["token_ids"] = token_ids or []
    out: dict[str, Any] = {"id": _id(req), "object": obj_type, "created": req.created, "model": req.model, "choices": [choice]}
    if first and req.return_token_ids and prompt_ids is not None:
        if req.kind == "chat":
            out["prompt_token_ids"] = prompt_ids
        else:
            choice["prompt_token_ids"] = prompt_ids
    if usage_now is not None:
        out["usage"] = usage_now
    return out


def final_usage_chunk(req: ServeRequest, usage_: dict[str, int], spec: dict[str, Any] | None) -> dict[str, Any]:
    """The closing chunk with `choices: []`, usage and (as vLLM) the per-request spec metrics."""
    out: dict[str, Any] = {"id": _id(req), "object": "chat.completion.chunk" if req.kind == "chat" else "text_completion",
                           "created": req.created, "model": req.model, "choices": [], "usage": usage_}
    if spec is not None:
        out["metrics"] = {"speculative_decoding": spec}
    return out


def full_response(req: ServeRequest, text: str, token_ids: list[int], prompt_ids: list[int], finish_reason: str,
                  usage_: dict[str, int], spec: dict[str, Any] | None, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The non-streaming body (`logprobs`: a LogprobsText body, when asked)."""
    if req.kind == "chat":
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "logprobs": logprobs, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
    out: dict[str, Any] = {"id": _id(req), "object": "chat.completion" if req.kind == "chat" else "text_completion",
                           "created": req.created, "model": req.model, "choices": [choice], "usage": usage_}
    if req.return_token_ids:
        choice["token_ids"] = token_ids
        if req.kind == "chat":
            out["prompt_token_ids"] = prompt_ids
        else:
            choice["prompt_token_ids"] = prompt_ids
    if spec is not None:
        out["metrics"] = {"speculative_decoding": spec}
    return out


def _id(req: ServeRequest) -> str:
    return ("chatcmpl-" if req.kind == "chat" else "cmpl-") + req.request_id
