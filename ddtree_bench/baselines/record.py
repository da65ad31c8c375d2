"""Recording a greedy baseline with the reference engine (`ddtree-bench baseline record`).

For every prompt and turn of a suite: render the conversation with the model's chat template,
decode greedily with plain AR (`Engine.generate(method="ar", return_logit_gaps=True)`), and keep
the prompt ids, the output ids and text, and the target's top-1 minus top-2 logit gap at every
output position. Multi-turn prompts carry the model's own earlier answers, exactly as the request
driver does (`driver._run_conversation`: the assistant message is the decoded output text), so a
faithful run's turn-t prompt ids equal the baseline's.

With `accept_method` (dflash | ddtree) the same prompt ids are also decoded speculatively and the
per-round acceptance lengths are stored, so `compare` and `gate` have a reference tau; the header
says which method and budget they came from, and each entry whether that output equalled AR's.

`rescore_gaps` fills logit gaps for a baseline made elsewhere (teacher-forced: one target forward
over prompt + output).

`record_from_server` makes the same AR-greedy baseline from a running OpenAI-compatible server
(vllm | sglang | standalone | openai): gaps are its top-1 minus top-2 logprobs, the header says
`source: "server"` and where it came from, and `compare` judges it with SERVER_NEAR_TIE_GAP.
Knows the engine, tokenizer, suites and (for servers) the HTTP client; nothing of runs on disk.
"""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

from ddtree_bench import defaults as D
from ddtree_bench.baselines.file import BaselineEntry
from ddtree_bench.errors import UsageError

ACCEPT_METHODS = ("dflash", "ddtree")


def check_args(max_new_tokens: int, limit: int | None, dtype: str, device: str, accept_method: str | None, budget: int) -> None:
    """Flag validation (UsageError naming the flag), through the same checks `ddtree-bench run` uses."""
    from ddtree_bench.run_spec import RunSpec

    if accept_method is not None and accept_method not in ACCEPT_METHODS:
        raise UsageError(f"unknown --accept-method {accept_method!r}; expected one of {', '.join(ACCEPT_METHODS)}")
    RunSpec(method=accept_method or "ar", budget=budget, limit=limit, max_new_tokens=max_new_tokens,
            dtype=dtype, device=device).validate()


def template_sha256(tokenizer: Any) -> str | None:
    t = getattr(tokenizer, "chat_template", None)
    return "sha256:" + hashlib.sha256(t.encode("utf-8")).hexdigest()[:32] if t else None


def environment_fields(device: str | None) -> dict[str, Any]:
    """versions / git sha / device description / command line, under names that do not clash with `device`."""
    from ddtree_bench.env import environment, now_iso

    env = environment(device)
    return {"versions": env["versions"], "git_sha": env["git_sha"], "device_info": env["device"],
            "command": env["command"], "created_at": now_iso()}


def record(model: str = D.MODEL, draft: str | None = None, suite: str = D.SUITE, limit: int | None = None,
           max_new_tokens: int = D.MAX_NEW_TOKENS, dtype: str = D.DTYPE, device: str = D.DEVICE,
           subset: str | None = None, accept_method: str | None = None, budget: int = D.BUDGET,
           progress: bool = True) -> tuple[dict[str, Any], list[BaselineEntry]]:
    """AR-greedy baseline of a suite: (header, entries). All input is validated before the model loads."""
    from tqdm.auto import tqdm

    from ddtree_bench.engine.interface import ContextTooLong, check_context, context_limit
    from ddtree_bench.pair import load_pair
    from ddtree_bench.suites.prompts import load_suite

    check_args(max_new_tokens, limit, dtype, device, accept_method, budget)
    loaded = load_suite(suite, limit, subset=subset)
    prompts, info = loaded.prompts, loaded.info
    pair = load_pair(model, draft, accept_method or "ar", dtype, device)
    engine, tok, stops = pair.engine, pair.tokenizer, list(pair.stop_ids)

    entries: list[BaselineEntry] = []
    bar = tqdm(total=sum(len(p.turns) for p in prompts), desc="baseline (ar)", unit="turn", disable=not progress, leave=False)
    mismatched = 0
    try:
        for p in prompts:
            messages: list[dict[str, str]] = []
            limit_p = p.max_new_tokens or max_new_tokens
            for turn, text in enumerate(p.turns):
                messages = messages + [{"role": "user", "content": text}]
                ids = tok.apply_chat_template(messages)
                try:
                    check_context(len(ids), limit_p, context_limit(engine.target))
                except ContextTooLong as e:
                    raise UsageError(f"{p.prompt_id} turn {turn}: {e}", hint="shorten the suite's prompts or "
                                     "--max-new-tokens; no server serves this prompt, so no baseline can hold it") from None
                g = engine.generate(ids, method="ar", max_new_tokens=limit_p, stop_ids=stops, return_logit_gaps=True)
                out_text = tok.decode(g.output_ids)
                e = BaselineEntry(p.prompt_id, turn, list(ids), list(g.output_ids), out_text,
                                  [float(x) for x in g.logit_gaps or []], None, g.finish_reason)
                if accept_method is not None:
                    s = engine.generate(ids, method=accept_method, budget=budget, max_new_tokens=limit_p, stop_ids=stops)
                    e.accept_lengths = list(s.accept_lengths)
                    e.extra["accept_output_matches"] = s.output_ids == g.output_ids
                    mismatched += s.output_ids != g.output_ids
                entries.append(e)
                messages = messages + [{"role": "assistant", "content": out_text}]
                bar.update(1)
    finally:
        bar.close()

    header: dict[str, Any] = {
        "source": "record",
        "method": "ar",
        "temperature": 0.0,
        "model": model,
        "draft": draft,
        "model_path": pair.info.get("model_path"),
        "model_hash": pair.info.get("model_hash"),
        "draft_path": pair.info.get("draft_path"),
        "draft_hash": pair.info.get("draft_hash"),
        "suite": info.name,
        "suite_info": info.to_dict(),
        "subset_rule": info.subset_rule,
        "template": info.template,
        "chat_template_sha256": template_sha256(tok),
        "limit": limit,
        "dtype": dtype,
        "device": device,
        "max_new_tokens": max_new_tokens,
        "stop_ids": stops,
        "accept_method": accept_method,
        "budget": budget if accept_method == "ddtree" else None,
        "block_size": engine.block_size if accept_method else None,
        "num_accept_output_mismatches": mismatched if accept_method else None,
        **environment_fields(device),
    }
    return header, entries


def _teacher_forced_rows(engine: Any, prompt_ids: list[int], output_ids: list[int]):
    """One target forward over prompt + output[:-1]: the float logits of the rows that predict each output token."""
    import torch

    seq = list(prompt_ids) + list(output_ids[:-1])
    dev = engine.device
    with torch.inference_mode():
        cache = engine.target.new_cache(len(seq))
        logits, _ = engine.target(torch.tensor(seq, dtype=torch.long, device=dev), torch.arange(len(seq), device=dev), cache, 0)
        return logits[len(prompt_ids) - 1:].float()


def rescore_gaps(engine: Any, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
    """Teacher-forced logit gaps: one target forward over prompt + output[:-1]; gap i is the
    top-1 minus top-2 logit of the row that predicts output_ids[i]. (A full-sequence forward is
    not bit-identical to incremental decoding; the difference is far below any near-tie threshold.)"""
    import torch

    if not output_ids:
        return []
    rows = _teacher_forced_rows(engine, prompt_ids, output_ids)
    if rows.shape[-1] < 2:
        return [float("inf")] * rows.shape[0]
    top2 = torch.topk(rows, 2, dim=-1).values
    return (top2[:, 0] - top2[:, 1]).tolist()


def token_deficits(engine: Any, prompt_ids: list[int], output_ids: list[int], implicit_stop: Sequence[int] = ()) -> list[float]:
    """Teacher-forced, over a run's own output: deficit i = the top-1 logit minus the logit of output_ids[i], on
    the row that predicts it (0 where the run took the top-1). A greedy decode with near-tie flips has every
    deficit below the near-tie threshold; one at or above it is a confident divergence from the run's own prefix.
    `implicit_stop` (the stop ids of a run that stopped without emitting one: servers that leave the EOS out) adds
    one deficit for the stop itself: the top-1 minus the best stop id's logit after the last token. The same one
    forward as `rescore_gaps`."""
    import torch

    stops = list(implicit_stop)
    if not output_ids and not stops:
        return []
    seq = list(output_ids) + stops[:1]
    rows = _teacher_forced_rows(engine, prompt_ids, seq)
    top = rows.max(dim=-1).values
    n = len(output_ids)
    took = rows[:n].gather(-1, torch.tensor(output_ids, dtype=torch.long, device=rows.device)[:, None])[:, 0]
    out = (top[:n] - took).tolist()
    if stops:
        out.append(float(top[n] - rows[n, torch.tensor(stops, dtype=torch.long, device=rows.device)].max()))
    return out


# ---------------------------------------------------------------------------- from a running server

SERVER_KINDS = ("vllm", "sglang", "standalone", "openai")


def logprob_gaps(content: Any) -> list[float | None] | None:
    """Top-1 minus top-2 log-probability per output token from an OpenAI `logprobs.content` list
    (chat) or a completions `logprobs.top_logprobs` list of {token: logprob} dicts; the same number
    as the logit gap (log-softmax shifts every logit of a row by one constant). None per token
    where fewer than two alternatives came back; None overall when there is no such list."""
    rows: list[list[float]] = []
    if isinstance(content, dict) and isinstance(content.get("content"), list):       # chat
        for c in content["content"]:
            tops = c.get("top_logprobs") if isinstance(c, dict) else None
            rows.append([t.get("logprob") for t in tops if isinstance(t, dict)] if isinstance(tops, list) else [])
    elif isinstance(content, dict) and isinstance(content.get("top_logprobs"), list):  # completions
        for d in content["top_logprobs"]:
            rows.append(list(d.values()) if isinstance(d, dict) else [])
    else:
        return None
    gaps: list[float | None] = []
    for r in rows:
        vals = sorted((float(x) for x in r if isinstance(x, (int, float)) and not isinstance(x, bool)), reverse=True)
        g = vals[0] - vals[1] if len(vals) >= 2 else None
        gaps.append(g if g is None or g == g and g != float("inf") else None)
    return gaps


async def _record_server(kind: str, url: str, model: str, prompts, max_new_tokens: int, api_key: str | None,
                         timeout_s: float, top_logprobs: int, bar) -> tuple[dict[str, Any], list[BaselineEntry], list[str]]:
    import asyncio
    import json

    import aiohttp

    from ddtree_bench.backends.client import ENDPOINTS, HTTPBackend, local_tokenizer
    from ddtree_bench.backends.parsers import error_message, parse_response
    from ddtree_bench.records import GenerationRequest

    be = HTTPBackend(kind, url, model=model, endpoint="chat", api_key=api_key, timeout_s=timeout_s, stream=False,
                     extra_body={"logprobs": True, "top_logprobs": top_logprobs})
    await be.start()
    tok = local_tokenizer(model)
    entries: list[BaselineEntry] = []
    notes: list[str] = []
    try:
        for p in prompts:
            messages: list[dict[str, str]] = []
            for turn, text in enumerate(p.turns):
                messages = messages + [{"role": "user", "content": text}]
                req = GenerationRequest(p.prompt_id, turn, messages, p.max_new_tokens or max_new_tokens, temperature=0.0, top_p=1.0)
                body, _ = be.payload(req)
                where = f"{p.prompt_id} turn {turn}"
                try:
                    async with be._session.post(be.url + ENDPOINTS["chat"], data=json.dumps(body).encode(),
                                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                        status, raw = resp.status, await resp.text()
                except asyncio.TimeoutError:
                    raise UsageError(f"the server at {be.url} gave no complete answer within {timeout_s:g} s ({where})",
                                     hint="check the server (its log, its load), or raise --timeout") from None
                except aiohttp.ClientError as e:
                    raise UsageError(f"the server at {be.url} broke the connection ({where}): {type(e).__name__}: "
                                     f"{' '.join(str(e).split())}", hint="check that the server is still up (its log)") from None
                try:
                    obj = json.loads(raw)
                except ValueError:
                    obj = None
                if status != 200 or not isinstance(obj, dict):
                    msg = error_message(obj) if isinstance(obj, dict) else raw.strip()[:300]
                    msg = " ".join(str(msg).split())
                    what = f"answered {status}" if status != 200 else "answered 200 with no JSON object"
                    raise UsageError(f"the server at {be.url} {what} to a greedy request with logprobs ({where}): {msg}",
                                     hint="the server failed: see its log" if status >= 500 else
                                     "the server must support the OpenAI logprobs/top_logprobs fields (vLLM, SGLang do)")
                st = parse_response(obj)
                ch = (obj.get("choices") or [{}])[0]
                gaps = logprob_gaps(ch.get("logprobs"))
                out_ids = list(st.output_ids) if st.saw_token_ids else None
                source = "server"
                if out_ids is None:
                    if tok is None:
                        raise UsageError(f"the server sends no token ids and --model {model!r} has no local tokenizer to re-tokenize its text",
                                         hint="pass --model /path/to/a/local/copy/of/the/served/model")
                    out_ids, source = tok.encode(st.text), "retokenized"
                prompt_ids = st.prompt_ids if st.prompt_ids is not None else (tok.apply_chat_template(messages) if tok is not None else None)
                if gaps is not None and len(gaps) != len(out_ids):
                    notes.append(f"{p.prompt_id}/{turn}: {len(gaps)} logprob rows for {len(out_ids)} tokens; gaps left unknown")
                    gaps = None
                if gaps is None:
                    notes.append(f"{p.prompt_id}/{turn}: no top_logprobs in the response; gaps unknown")
                e = BaselineEntry(p.prompt_id, turn, prompt_ids, out_ids, st.text, gaps, None, st.finish_reason,
                                  {"token_source": source})
                entries.append(e)
                messages = messages + [{"role": "assistant", "content": st.text}]
                bar.update(1)
    finally:
        await be.aclose()
    return be.describe(), entries, notes


def record_from_server(kind: str, url: str, model: str = D.MODEL, suite: str = D.SUITE, limit: int | None = None,
                       max_new_tokens: int = D.MAX_NEW_TOKENS, subset: str | None = None, api_key: str | None = None,
                       timeout_s: float = D.REQUEST_TIMEOUT_S, top_logprobs: int = D.SERVER_TOP_LOGPROBS,
                       progress: bool = True) -> tuple[dict[str, Any], list[BaselineEntry]]:
    """AR-greedy baseline from a running OpenAI-compatible server: (header, entries).

    One non-streamed chat request per turn, temperature 0, `logprobs: true, top_logprobs: k`; the
    logit gap at each output token is the top-1 minus top-2 log-probability the server returned
    (in the server's own precision, usually bf16: `compare` then uses SERVER_NEAR_TIE_GAP). The
    header says where it came from: backend, url, server version, served model, the local model
    used for the chat template / stop ids, and the threshold that applies."""
    import asyncio

    from tqdm.auto import tqdm

    from ddtree_bench.suites.prompts import load_suite

    if kind not in SERVER_KINDS:
        raise UsageError(f"--backend {kind!r} cannot record a baseline from a server; expected one of {', '.join(SERVER_KINDS)}")
    if not 2 <= top_logprobs <= 20:
        raise UsageError(f"--top-logprobs must be in 2..20, got {top_logprobs}")
    check_args(max_new_tokens, limit, D.DTYPE, D.DEVICE, None, D.BUDGET)
    loaded = load_suite(suite, limit, subset=subset)
    prompts, info = loaded.prompts, loaded.info
    bar = tqdm(total=sum(len(p.turns) for p in prompts), desc=f"baseline ({kind})", unit="turn", disable=not progress, leave=False)
    try:
        described, entries, notes = asyncio.run(_record_server(kind, url, model, prompts, max_new_tokens, api_key, timeout_s, top_logprobs, bar))
    finally:
        bar.close()
    stops = None
    try:
        from ddtree_bench.pair import model_dirs
        from ddtree_bench.tokenizer import ChatTokenizer, generation_stop_ids

        tdir, _ = model_dirs(model, None)
        if tdir is not None and (tdir / "tokenizer.json").exists():
            stops = generation_stop_ids(tdir, ChatTokenizer(tdir))
    except (UsageError, OSError):
        stops = None
    header: dict[str, Any] = {
        "source": "server",
        "method": "ar",
        "temperature": 0.0,
        "model": model,
        "draft": None,
        "backend": kind,
        "url": described.get("url"),
        "served_model": described.get("served_model"),
        "server_version": described.get("server_version"),
        "server_info": described.get("server_info"),
        "suite": info.name,
        "suite_info": info.to_dict(),
        "subset_rule": info.subset_rule,
        "template": info.template,
        "limit": limit,
        "dtype": (described.get("server_info") or {}).get("dtype") if isinstance(described.get("server_info"), dict) else None,
        "device": None,
        "max_new_tokens": max_new_tokens,
        "stop_ids": stops,
        "gap_source": f"server logprobs (top_logprobs={top_logprobs})",
        "near_tie_gap": D.SERVER_NEAR_TIE_GAP,
        "num_entries_without_gaps": sum(1 for e in entries if e.logit_gap is None),
        "notes": notes[:20],
        **environment_fields(None),
    }
    return header, entries
