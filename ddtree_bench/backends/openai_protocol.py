"""The OpenAI-compatible wire format of `ddtree-bench serve`: request validation and response shapes.

`parse_request(obj, kind, ...)` turns a decoded JSON body into a `ServeRequest` or raises
`ApiError` with the HTTP status and a message that names the offending field (400), the unknown
model (404, as OpenAI and vLLM answer) or an unsupported feature (400). Unknown fields are
ignored, as vLLM and SGLang do. The response builders produce the shapes vLLM uses, so one client
reads every engine: completions `choices[].text`, chat `choices[].delta|message`, `token_ids` per
choice (deltas when streaming), `prompt_token_ids` (in the choice for completions, top level for
chat), `usage`, and `metrics.speculative_decoding` (vLLM's per-request spec metrics) extended with
our exact per-round `acceptance_lengths`.

Knows JSON shapes; nothing of models, sockets or timing.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from ddtree_bench import defaults as D


class ApiError(Exception):
    """A request the server refuses: HTTP `status`, OpenAI error `type`, the offending `param`."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.type, self.param)


def error_body(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": status}}


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
    ignore_eos: bool = False
    enable_thinking: bool = False
    prompt_text: str | None = None            # completions
    prompt_ids: list[int] | None = None       # completions
    messages: list[dict[str, str]] | None = None  # chat
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _opt(obj: dict[str, Any], key: str, check, what: str, default: Any = None) -> Any:
    v = obj.get(key)
    if v is None:
        return default
    if not check(v):
        raise ApiError(400, f"'{key}' must be {what}, got {type(v).__name__} {str(v)[:60]!r}", param=key)
    return v


def _token_list(v: Any, vocab_size: int, key: str) -> list[int]:
    if not all(_is_int(t) for t in v):
        raise ApiError(400, f"'{key}' token ids must be integers", param=key)
    bad = next((t for t in v if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ApiError(400, f"'{key}' has token id {bad}, outside the vocabulary [0, {vocab_size})", param=key)
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
    raise ApiError(400, f"'messages[{i}].content' must be a string or a list of text parts", param="messages")


def parse_request(obj: Any, kind: str, served_model: str, vocab_size: int) -> ServeRequest:
    """Validate a decoded request body for `kind` ("chat" | "completions")."""
    if not isinstance(obj, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(obj).__name__}")
    model = obj.get("model", served_model)
    if model is None:
        model = served_model
    if not isinstance(model, str):
        raise ApiError(400, "'model' must be a string", param="model")
    if model != served_model:
        raise ApiError(404, f"the model '{model}' does not exist; this server serves '{served_model}'",
                       type_="NotFoundError", param="model")
    n = _opt(obj, "n", _is_int, "an integer", 1)
    if n != 1:
        raise ApiError(400, "only n = 1 is supported", param="n")
    unsupported = {  # field: (values that mean "off", message)
        "logprobs": ((None, False), "logprobs are not supported"),
        "top_logprobs": ((None, 0), "logprobs are not supported"),
        "best_of": ((None, 1), "best_of is not supported"),
        "echo": ((None, False), "echo is not supported"),
        "suffix": ((None, ""), "suffix is not supported"),
        "tools": ((None, []), "tools are not supported"),
        "stop": ((None, [], ""), "stop strings are not supported; use stop_token_ids"),
    }
    for key, (off, why) in unsupported.items():
        if key in obj and not any(obj[key] == v and type(obj[key]) is type(v) for v in off):
            raise ApiError(400, why, param=key)

    if kind == "chat":
        max_tokens = obj.get("max_completion_tokens", obj.get("max_tokens"))
        key = "max_completion_tokens" if obj.get("max_completion_tokens") is not None else "max_tokens"
        default_max = D.MAX_NEW_TOKENS
    else:
        max_tokens, key, default_max = obj.get("max_tokens"), "max_tokens", D.SERVE_COMPLETIONS_MAX_TOKENS
    if max_tokens is None:
        max_tokens = default_max
    if not _is_int(max_tokens) or max_tokens <= 0:
        raise ApiError(400, f"'{key}' must be a positive integer, got {max_tokens!r}", param=key)

    temperature = _opt(obj, "temperature", _is_num, "a number", 1.0)
    if temperature < 0:
        raise ApiError(400, f"'temperature' must be >= 0, got {temperature}", param="temperature")
    top_p = _opt(obj, "top_p", _is_num, "a number", 1.0)
    if not 0 < top_p <= 1:
        raise ApiError(400, f"'top_p' must be in (0, 1], got {top_p}", param="top_p")
    seed = _opt(obj, "seed", _is_int, "an integer")
    stream = _opt(obj, "stream", lambda v: isinstance(v, bool), "a boolean", False)
    so = _opt(obj, "stream_options", lambda v: isinstance(v, dict), "an object", {})
    include_usage = so.get("include_usage", False)
    continuous = so.get("continuous_usage_stats", False)
    if not isinstance(include_usage, bool) or not isinstance(continuous, bool):
        raise ApiError(400, "'stream_options' fields must be booleans", param="stream_options")
    stop_ids = _opt(obj, "stop_token_ids", lambda v: isinstance(v, list), "a list of token ids")
    if stop_ids is not None:
        stop_ids = _token_list(stop_ids, vocab_size, "stop_token_ids")
    ignore_eos = _opt(obj, "ignore_eos", lambda v: isinstance(v, bool), "a boolean", False)
    ret_ids = _opt(obj, "return_token_ids", lambda v: isinstance(v, bool), "a boolean", False)
    ctk = _opt(obj, "chat_template_kwargs", lambda v: isinstance(v, dict), "an object", {})
    enable_thinking = bool(ctk.get("enable_thinking", False))

    req = ServeRequest(kind=kind, model=served_model, max_tokens=max_tokens, temperature=float(temperature),
                       top_p=float(top_p), seed=seed, stream=stream, include_usage=include_usage,
                       continuous_usage=continuous, return_token_ids=ret_ids, stop_token_ids=stop_ids,
                       ignore_eos=ignore_eos, enable_thinking=enable_thinking)
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
                raise ApiError(400, f"'messages[{i}].role' {m['role']!r} is not supported (system, user, assistant)", param="messages")
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
    """
    rounds = len(accept_lengths)
    accepted = sum(a - 1 for a in accept_lengths)
    per_round = {"ddtree": budget, "dflash": block_size - 1}.get(method, 0)
    drafted = rounds * per_round
    width = max([block_size] + list(accept_lengths))
    hist = [0] * width
    for a in accept_lengths:
        hist[a - 1] += 1
    return {
        "method": method,
        "mean_acceptance_length": (1 + accepted / rounds) if rounds else None,
        "draft_acceptance_rate": (accepted / drafted) if drafted else None,
        "acceptance_histogram": hist,
        "num_spec_steps": rounds,
        "num_draft_tokens": drafted,
        "num_accepted_draft_tokens": accepted,
        "num_spec_tokens": block_size - 1,
        "tree_budget": budget if method == "ddtree" else None,
        "acceptance_lengths": list(accept_lengths),
    }


def stream_chunk(req: ServeRequest, text: str, token_ids: list[int] | None, *, finish_reason: str | None = None,
                 first: bool = False, prompt_ids: list[int] | None = None,
                 usage_now: dict[str, int] | None = None) -> dict[str, Any]:
    """One SSE chunk carrying `text` / `token_ids` (the delta since the previous chunk)."""
    if req.kind == "chat":
        delta: dict[str, Any] = {"content": text}
        if first:
            delta["role"] = "assistant"
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        obj_type = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
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
                  usage_: dict[str, int], spec: dict[str, Any] | None) -> dict[str, Any]:
    """The non-streaming body."""
    if req.kind == "chat":
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
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
