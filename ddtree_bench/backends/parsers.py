"""Reading OpenAI-compatible responses from SGLang, vLLM and `ddtree-bench serve` into one shape.

Two jobs, both pure functions over parsed JSON (no I/O, no timing):

* `StreamState` folds the JSON objects of an SSE stream (or `parse_response` one non-streaming
  body) into text, token ids, per-chunk token counts, usage and finish reason. A chunk's token
  count is, in order of preference: the length of its `token_ids` delta (`return_token_ids`), the
  growth of `usage.completion_tokens` (`stream_options.continuous_usage_stats`), else 1 per chunk
  that carries text (flagged, since a speculative chunk may carry many tokens). Usage growth
  counts only while every earlier counted chunk was counted by usage too: a cumulative usage that
  first appears on the last chunk (transformers serve, vLLM without continuous stats) already
  covers the chunks counted by text, so that chunk is not credited the whole total again.
  Token ids also come whole: SGLang's `choices[].response_token_ids` (chat, non-streaming) and
  `sglext.output_ids` / `sglext.input_ids` (chat, `return_output_ids_in_sglext`; streamed once,
  in a `choices: []` chunk near the end; one id list per choice).
* `spec_stats(obj)` finds per-request speculative-decoding stats wherever an engine puts them, and
  `accept_lengths_from_stats` turns them into per-round acceptance lengths a_r (root/bonus counted):
    - ours (`metrics.speculative_decoding.acceptance_lengths`): the exact rounds -> "rounds";
    - vLLM (`metrics.speculative_decoding`, --per-request-spec-decode-metrics): `per_step_accepted`
      (detailed) -> "rounds" as accepted + 1; else `acceptance_histogram` (index j = steps that
      accepted exactly j drafts) -> the multiset of j + 1 -> "histogram";
    - SGLang (`sglext.spec_tokens_details`, a list when n > 1; `meta_info` / `choices[].meta_info`
      of /generate and chat `return_meta_info`): `spec_correct_drafts_histogram` (>= 0.5.12) or
      `spec_accept_histogram` (<= 0.5.11), same indexing -> "histogram";
    - llama.cpp (`timings.draft_n` / `draft_n_accepted`, cumulative over the request; in every chunk
      with `timings_per_token`): `draft_n` grows once per verify round (by that round's draft length,
      before verification) and `draft_n_accepted` by its accepted drafts, and every round emits at
      least one chunk, so the distinct `draft_n` values of a stream are its rounds and the growth of
      `draft_n_accepted` between them each round's accepted drafts -> `per_step_accepted` -> "rounds".
      A step without a draft (the last token of the budget) leaves `draft_n` unchanged: not a round,
      as in the server's own count. One non-streamed body carries the totals only (no rounds).
  Token ids of llama-server are in `__verbose.tokens` (`verbose` + `return_tokens`).
  Totals alone (a mean, counts) cannot be turned into rounds: accept_lengths is then None and the
  stats stay in `server_stats`.

Knows response shapes; nothing of sockets, records or metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# SGLang renamed its per-request spec keys twice (serving-engines.md §1.9); newest first.
SGLANG_HISTOGRAM_KEYS = ("spec_correct_drafts_histogram", "spec_accept_histogram")
SGLANG_ACCEPTED_KEYS = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
SGLANG_PROPOSED_KEYS = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")


class ResponseError(Exception):
    """The server reported an error inside a 200 response (an SSE `{"error": ...}` event)."""


def error_message(body: Any) -> str:
    """The human message of an error body in any of the usual shapes (OpenAI, vLLM, SGLang, FastAPI)."""
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            for key in ("message", "detail", "msg"):
                if isinstance(err.get(key), str):
                    return err[key]
        if isinstance(err, str):
            return err
        for key in ("message", "detail"):
            v = body.get(key)
            if isinstance(v, str):
                return v
            if isinstance(v, list) and v and isinstance(v[0], dict) and "msg" in v[0]:  # FastAPI validation
                return "; ".join(str(x.get("msg")) for x in v)
    return str(body)[:500]


# ---------------------------------------------------------------------------- spec stats


def _first(obj: Any) -> Any:
    return obj[0] if isinstance(obj, list) and obj else obj


def spec_stats(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The per-request speculative stats in one response body or stream chunk, tagged with their
    `source` shape ("ddtree-bench" | "vllm" | "sglang-sglext" | "sglang-meta_info"); None if absent."""
    if not isinstance(obj, dict):
        return None
    metrics = obj.get("metrics")
    if isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict):
        sd = dict(metrics["speculative_decoding"])
        return {"source": "ddtree-bench" if "acceptance_lengths" in sd else "vllm", **sd}
    timings = obj.get("timings")
    if isinstance(timings, dict) and isinstance(timings.get("draft_n"), int):
        keep = ("draft_n", "draft_n_accepted", "predicted_n", "prompt_n", "cache_n")
        return {"source": "llamacpp", **{k: timings[k] for k in keep if k in timings}}
    sglext = obj.get("sglext")
    if isinstance(sglext, dict) and sglext.get("spec_tokens_details") is not None:
        details = _first(sglext["spec_tokens_details"])
        if isinstance(details, dict):
            return {"source": "sglang-sglext", **details}
    metas = [obj.get("meta_info")]
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        metas.append(choices[0].get("meta_info"))
    for meta in metas:
        if isinstance(meta, dict) and any(k.startswith("spec_") for k in meta):
            keep = {k: v for k, v in meta.items()
                    if k.startswith("spec_") or k in ("completion_tokens", "prompt_tokens", "e2e_latency", "cached_tokens")}
            return {"source": "sglang-meta_info", **keep}
    return None


def _histogram_rounds(hist: Any) -> list[int] | None:
    """[j] = steps that accepted exactly j drafts  ->  the multiset of a = j + 1, ascending."""
    if not isinstance(hist, list) or not all(isinstance(c, int) and c >= 0 for c in hist):
        return None
    return [j + 1 for j, count in enumerate(hist) for _ in range(count)]


def accept_lengths_from_stats(stats: dict[str, Any] | None) -> tuple[list[int] | None, str | None]:
    """(a_r per round, "rounds" | "histogram") from `spec_stats` output; (None, None) when impossible."""
    if not stats:
        return None, None
    exact = stats.get("acceptance_lengths")
    if isinstance(exact, list) and all(isinstance(a, int) and a >= 1 for a in exact):
        return list(exact), "rounds"
    per_step = stats.get("per_step_accepted")
    if isinstance(per_step, list) and all(isinstance(a, int) and a >= 0 for a in per_step):
        return [a + 1 for a in per_step], "rounds"
    for key in ("acceptance_histogram", *SGLANG_HISTOGRAM_KEYS):
        rounds = _histogram_rounds(stats.get(key))
        if rounds is not None:
            return rounds, "histogram"
    return None, None


def stats_totals(stats: dict[str, Any] | None) -> dict[str, float | int | None]:
    """Engine-neutral totals from any shape: verify rounds, accepted drafts (no bonus), proposed drafts."""
    if not stats:
        return {}
    def pick(*keys):
        return next((stats[k] for k in keys if isinstance(stats.get(k), (int, float))), None)
    return {
        "rounds": pick("num_spec_steps", "spec_verify_ct"),
        "accepted_drafts": pick("num_accepted_draft_tokens", *SGLANG_ACCEPTED_KEYS),
        "proposed_drafts": pick("num_draft_tokens", *SGLANG_PROPOSED_KEYS),
        "mean_acceptance_length": pick("mean_acceptance_length", "spec_accept_length"),
    }


# ---------------------------------------------------------------------------- stream folding


@dataclass
class ChunkUpdate:
    """What one stream chunk added: text, token ids (None when the server sent none) and a token count."""

    text: str = ""
    token_ids: list[int] | None = None
    num_tokens: int = 0


@dataclass
class StreamState:
    """Accumulates one response from its stream chunks (or one whole body). Feed with `feed(obj)`."""

    text_parts: list[str] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    saw_token_ids: bool = False
    prompt_ids: list[int] | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    stats: dict[str, Any] | None = None
    token_count_source: str | None = None   # "token_ids" | "usage" | "text-chunks"
    _usage_tokens: int = 0
    _llama_rounds: list[tuple[int, int]] = field(default_factory=list)  # (draft_n, draft_n_accepted) per round
    _llama_whole_body: bool = False
    _objects_fed: int = 0

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def feed(self, obj: dict[str, Any]) -> ChunkUpdate:
        """Fold one JSON object (stream chunk or whole body) in. Raises ResponseError on an error event."""
        if not isinstance(obj, dict):
            raise ResponseError(f"expected a JSON object, got {type(obj).__name__}")
        self._objects_fed += 1
        if "error" in obj and not obj.get("choices"):
            raise ResponseError(error_message(obj))
        choices = obj.get("choices") or []
        ch = choices[0] if choices else None
        if choices and not isinstance(ch, dict):
            raise ResponseError("malformed choice")
        if "metrics" in obj or "sglext" in obj or "meta_info" in obj or "timings" in obj or (ch is not None and "meta_info" in ch):
            stats = spec_stats(obj)
            if stats is not None:
                self.stats = stats
                if stats["source"] == "llamacpp":
                    self._llama_round(stats)
        if isinstance(obj.get("prompt_token_ids"), list):  # vLLM chat: top level, first chunk
            self.prompt_ids = list(obj["prompt_token_ids"])
        upd = ChunkUpdate()
        if ch is not None:
            delta = ch.get("delta")
            if isinstance(delta, dict):                      # chat stream
                upd.text = delta.get("content") or ""
            elif isinstance(ch.get("message"), dict):        # chat, non-streaming
                upd.text = ch["message"].get("content") or ""
            else:                                            # completions
                upd.text = ch.get("text") or ""
            ids = ch.get("token_ids")
            if not isinstance(ids, list):
                ids = ch.get("response_token_ids")           # SGLang chat, non-streaming
            if not isinstance(ids, list) and isinstance(obj.get("__verbose"), dict):
                ids = obj["__verbose"].get("tokens")         # llama-server (verbose + return_tokens)
            if isinstance(ids, list):
                upd.token_ids = ids
            if isinstance(ch.get("prompt_token_ids"), list):  # vLLM completions: in the choice
                self.prompt_ids = list(ch["prompt_token_ids"])
            if ch.get("finish_reason"):
                self.finish_reason = ch["finish_reason"]
        ext_prompt, ext_output = _sglext_ids(obj)
        if ext_prompt is not None:
            self.prompt_ids = ext_prompt
        if ext_output is not None and upd.token_ids is None:
            if ch is not None:                               # a whole body: the chunk carries them
                upd.token_ids = ext_output
            else:                                            # the stream's ids chunk: whole, not a delta
                self.output_ids = list(ext_output)
                self.saw_token_ids = True
        usage = obj.get("usage")
        new_usage_tokens = None
        if isinstance(usage, dict):
            self.usage = usage
            if isinstance(usage.get("completion_tokens"), int):
                new_usage_tokens = usage["completion_tokens"]
        if upd.token_ids is not None:
            self.saw_token_ids = True
            self.output_ids.extend(upd.token_ids)
            upd.num_tokens = len(upd.token_ids)
            self.token_count_source = "token_ids"
        elif choices and new_usage_tokens is not None and self.token_count_source in (None, "usage"):
            upd.num_tokens = max(0, new_usage_tokens - self._usage_tokens)
            self.token_count_source = "usage"
        elif choices and upd.text and self.token_count_source in (None, "text-chunks"):
            upd.num_tokens = 1
            self.token_count_source = "text-chunks"
        if new_usage_tokens is not None:
            self._usage_tokens = new_usage_tokens
        self.text_parts.append(upd.text)
        return upd

    def _llama_round(self, stats: dict[str, Any]) -> None:
        """Fold one llama-server `timings` into the rounds (module docstring) and the stats derived from them."""
        d, a = stats.get("draft_n"), stats.get("draft_n_accepted", 0)
        if not isinstance(d, int) or not isinstance(a, int):
            return
        if d > 0 and (not self._llama_rounds or d > self._llama_rounds[-1][0]):
            if not self._llama_rounds and self._objects_fed == 1:
                self._llama_whole_body = True   # the first object already had drafts: totals only, no rounds
            self._llama_rounds.append((d, a))
        elif self._llama_rounds and d == self._llama_rounds[-1][0]:
            self._llama_rounds[-1] = (d, a)
        if self._llama_rounds and not self._llama_whole_body:
            prev = [0] + [x for _, x in self._llama_rounds[:-1]]
            stats["per_step_accepted"] = [x - p for (_, x), p in zip(self._llama_rounds, prev)]
            stats["num_spec_steps"] = len(self._llama_rounds)
        stats["num_accepted_draft_tokens"] = a
        stats["num_draft_tokens"] = d

    @property
    def usage_completion_tokens(self) -> int | None:
        v = (self.usage or {}).get("completion_tokens")
        return v if isinstance(v, int) else None

    @property
    def usage_prompt_tokens(self) -> int | None:
        v = (self.usage or {}).get("prompt_tokens")
        return v if isinstance(v, int) else None


def _sglext_ids(obj: dict[str, Any]) -> tuple[list[int] | None, list[int] | None]:
    """(prompt ids, output ids of choice 0) from SGLang's `sglext.input_ids` / `sglext.output_ids`
    (one list per choice, even for n = 1; a flat list is read as choice 0's); (None, None) if absent."""
    ext = obj.get("sglext")
    if not isinstance(ext, dict):
        return None, None
    prompt, out = ext.get("input_ids"), ext.get("output_ids")
    prompt = list(prompt) if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) else None
    if isinstance(out, list) and out and isinstance(out[0], list):
        out = out[0]
    out = list(out) if isinstance(out, list) and all(isinstance(t, int) for t in out) else None
    return prompt, out


def parse_response(body: dict[str, Any]) -> StreamState:
    """A whole non-streaming response (completions or chat) folded like a one-chunk stream."""
    state = StreamState()
    state.feed(body)
    return state
