"""Recording a greedy baseline with the reference engine (`ddtree-bench baseline record`).

For every prompt and turn of a suite: render the conversation with the model's chat template,
decode greedily with plain AR (`Engine.generate(method="ar", return_logit_gaps=True)`), and keep
the prompt ids, the output ids and text, and the target's top-1 minus top-2 logit gap at every
output position. Multi-turn prompts carry the model's own earlier answers, exactly as the request
driver does (`load._run_conversation`: the assistant message is the decoded output text), so a
faithful run's turn-t prompt ids equal the baseline's.

With `accept_method` (dflash | ddtree) the same prompt ids are also decoded speculatively and the
per-round acceptance lengths are stored, so `compare` and `gate` have a reference tau; the header
says which method and budget they came from, and each entry whether that output equalled AR's.

`rescore_gaps` fills logit gaps for a baseline made elsewhere (teacher-forced: one target forward
over prompt + output). Knows the engine, tokenizer and suites; nothing of HTTP or runs on disk.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ddtree_bench import defaults as D
from ddtree_bench.baseline import BaselineEntry
from ddtree_bench.errors import UsageError

ACCEPT_METHODS = ("dflash", "ddtree")


def check_args(max_new_tokens: int, limit: int | None, dtype: str, device: str, accept_method: str | None, budget: int) -> None:
    """Flag validation (UsageError naming the flag), through the same checks `ddtree-bench run` uses."""
    from ddtree_bench.config import RunSpec

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

    from ddtree_bench.pair import load_pair
    from ddtree_bench.suites import load_prompts

    check_args(max_new_tokens, limit, dtype, device, accept_method, budget)
    prompts, info = load_prompts(suite, limit, subset=subset)
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


def rescore_gaps(engine: Any, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
    """Teacher-forced logit gaps: one target forward over prompt + output[:-1]; gap i is the
    top-1 minus top-2 logit of the row that predicts output_ids[i]. (A full-sequence forward is
    not bit-identical to incremental decoding; the difference is far below any near-tie threshold.)"""
    import torch

    if not output_ids:
        return []
    target = engine.target
    seq = list(prompt_ids) + list(output_ids[:-1])
    dev = engine.device
    with torch.inference_mode():
        cache = target.new_cache(len(seq))
        ids = torch.tensor(seq, dtype=torch.long, device=dev)
        logits, _ = target(ids, torch.arange(len(seq), device=dev), cache, 0)
        rows = logits[len(prompt_ids) - 1:].float()
        if rows.shape[-1] < 2:
            return [float("inf")] * rows.shape[0]
        top2 = torch.topk(rows, 2, dim=-1).values
        return (top2[:, 0] - top2[:, 1]).tolist()
