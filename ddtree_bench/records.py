"""Typed records that flow one way: suite -> Prompt -> backend -> RequestRecord -> metrics -> results.

Every backend (in-process engine, our standalone server, SGLang, vLLM) turns a `GenerationRequest`
into exactly one `RequestRecord`, so every metric is computed once, in `metrics.py`. Records are
plain dataclasses that round-trip through JSON (`to_json` / `from_json`); units are in the names
(`t_send_ns` is a `time.perf_counter_ns()` reading, `stage_ms` is milliseconds).

This module knows nothing of models, HTTP or files on disk.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Prompt:
    """One benchmark item: a conversation of user turns (z-lab's cache format `{"id", "turns"}`).

    Multi-turn items (MT-Bench) are run turn by turn; turn t's request carries the model's own
    answers to turns < t.
    """

    prompt_id: str
    turns: list[str]
    max_new_tokens: int | None = None      # per-item override; None = the run's setting
    meta: dict[str, Any] = field(default_factory=dict)  # e.g. category, source index


@dataclass
class GenerationRequest:
    """What a backend is asked to do for one turn of one prompt."""

    prompt_id: str
    turn: int                               # 0-based
    messages: list[dict[str, str]]          # [{"role": "user"|"assistant", "content": str}, ...]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    prompt_ids: list[int] | None = None     # pre-rendered token ids, when the caller has them


@dataclass
class RequestRecord:
    """The outcome of one request, identical in shape for every backend.

    `accept_lengths[r]` is a_r: tokens committed by verify round r *counting the root* (the previous
    round's bonus token), before any truncation for EOS or max_new_tokens; all 1 for AR; None when
    the backend reports none. `accept_lengths_source` says how they were obtained: "rounds" (exact
    per-round list), "histogram" (rebuilt from an engine histogram, order lost) or None.
    Timestamps are `perf_counter_ns()` readings on the client; `chunk_times_ns[i]` is when chunk i
    arrived and `chunk_tokens[i]` how many tokens it carried.
    `token_source` says where `output_ids` came from: "server" (the server sent the ids),
    "retokenized" (the server sent text only; the client tokenized it with the model's local
    tokenizer, so a difference can come from tokenization) or None (the in-process engine's own
    ids, no ids at all, or a record written before the field existed: run.json version 1).
    """

    prompt_id: str
    turn: int = 0
    prompt_ids: list[int] | None = None
    output_ids: list[int] | None = None     # generated tokens only (prompt excluded)
    output_text: str = ""
    accept_lengths: list[int] | None = None
    accept_lengths_source: str | None = None
    num_prompt_tokens: int | None = None
    num_output_tokens: int | None = None
    finish_reason: str | None = None        # "stop" | "length" | None on error
    t_send_ns: int | None = None
    t_first_token_ns: int | None = None
    t_done_ns: int | None = None
    chunk_times_ns: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    stage_ms: dict[str, float] | None = None  # engine stage totals where known
    server_stats: dict[str, Any] | None = None  # raw engine-reported spec stats (parsed shapes)
    error: str | None = None                # None when ok
    # When the request actually left the client. Equal to t_send_ns except in open-loop runs, where
    # t_send_ns is the scheduled Poisson arrival and the difference is the client's own lag.
    t_dispatch_ns: int | None = None
    token_source: str | None = None         # "server" | "retokenized" | None (see the class docstring)

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> str:
        return json.dumps(_clean(dataclasses.asdict(self)), ensure_ascii=False, allow_nan=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RequestRecord":
        """A record from its JSON object; unknown keys are ignored, a field of the wrong type or range is a
        ValueError naming it (so a hand-edited or foreign records.jsonl is refused, not half-computed)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kept = {k: v for k, v in d.items() if k in names}
        if "prompt_id" not in kept:
            raise ValueError('no "prompt_id"')
        if isinstance(kept["prompt_id"], int) and not isinstance(kept["prompt_id"], bool):
            kept["prompt_id"] = str(kept["prompt_id"])
        for k, v in kept.items():
            check, what = _FIELD_RULES[k]
            if not check(v):
                raise ValueError(f'"{k}" must be {what}, got {json.dumps(v)[:60]}')
        ct, ck = kept.get("chunk_times_ns") or [], kept.get("chunk_tokens") or []
        if ct and ck and len(ct) != len(ck):
            raise ValueError(f'"chunk_times_ns" has {len(ct)} entries for {len(ck)} in "chunk_tokens"')
        return cls(**kept)


def _is_int(v: Any, lo: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _ints(lo: int = 0):
    return lambda v: isinstance(v, list) and all(_is_int(x, lo) for x in v)


def _or_none(check):
    return lambda v: v is None or check(v)


_STR = lambda v: isinstance(v, str)  # noqa: E731
_FIELD_RULES: dict[str, tuple[Any, str]] = {   # field -> (check, what it must be, for the error line)
    "prompt_id": (lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    "turn": (_is_int, "an integer >= 0"),
    "prompt_ids": (_or_none(_ints()), "a list of token ids (integers >= 0) or null"),
    "output_ids": (_or_none(_ints()), "a list of token ids (integers >= 0) or null"),
    "output_text": (_STR, "a string"),
    "accept_lengths": (_or_none(_ints(1)), "a list of integers >= 1 (each round counts its bonus token) or null"),
    "accept_lengths_source": (_or_none(_STR), "a string or null"),
    "num_prompt_tokens": (_or_none(_is_int), "an integer >= 0 or null"),
    "num_output_tokens": (_or_none(_is_int), "an integer >= 0 or null"),
    "finish_reason": (_or_none(_STR), "a string or null"),
    "t_send_ns": (_or_none(_is_num), "a number (ns) or null"),
    "t_first_token_ns": (_or_none(_is_num), "a number (ns) or null"),
    "t_done_ns": (_or_none(_is_num), "a number (ns) or null"),
    "t_dispatch_ns": (_or_none(_is_num), "a number (ns) or null"),
    "chunk_times_ns": (lambda v: isinstance(v, list) and all(_is_num(x) for x in v), "a list of numbers (ns)"),
    "chunk_tokens": (_ints(), "a list of integers >= 0"),
    "stage_ms": (_or_none(lambda v: isinstance(v, dict) and all(_is_num(x) or x is None for x in v.values())),
                 "an object of numbers (ms) or null"),
    "server_stats": (_or_none(lambda v: isinstance(v, dict)), "an object or null"),
    "error": (_or_none(_STR), "a string or null"),
    "token_source": (_or_none(_STR), "a string or null"),
}


def _clean(obj: Any) -> Any:
    """JSON-safe copy: NaN and +-inf become None, so every line stays valid JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def json_safe(obj: Any) -> Any:
    """Public name for `_clean`: use before `json.dump(..., allow_nan=False)`."""
    return _clean(obj)
