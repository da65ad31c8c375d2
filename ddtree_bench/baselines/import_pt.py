"""Importing the DDTree authors' benchmark files (`benchmark.py --save-path RUN.pt`) as a baseline.

The file is a pickled dict (docs: ddtree-algorithm.md §7.2): `responses` is a list with one dict
per (item, turn), keyed by method ("baseline" = their AR, "dflash", "ddtree_tb16" ...), each value
a SimpleNamespace with `output_ids` (LongTensor [1, n_in + n_out], prompt included, cut after the
first EOS inclusive), `num_input_tokens` and `acceptance_lengths`; plus `args`, `block_size`.
It stores no ids, no prompt text and no dataset index; the order is ranks concatenated (rank 0's
items 0, W, 2W, ..., then rank 1's ...), and MT-Bench contributes two consecutive responses per
item, turn 2's prompt carrying the answer of the *last method run* (§7.3).

So each response is matched to the suite by its prompt tokens `output_ids[0, :num_input_tokens]`:
  1. exact token-id match with a templated first turn of the suite;
  2. else decoded-text match (`decode(skip_special_tokens=False)` equals the rendered template);
  3. else as turn t+1 of a matched turn t of a multi-turn item: exact ids when the conversation is
     re-rendered with one of that response's methods' answers (stored as `context_method`); and,
     when it directly follows turn t in the file (the authors' layout), the decoded prompt
     containing the suite's turn t+1 text is enough.
Unmatched responses are reported, never guessed. Loading a pickle runs code from the file, so it
is refused unless the caller says it trusts the file. Knows tokenizers and suites; no engine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddtree_bench.baselines.file import BaselineEntry
from ddtree_bench.errors import UsageError
from ddtree_bench.records import Prompt

TRUST_HINT = "pass --trust-pickle only for files you made or whose source you trust"


def load_pt(path: str | Path, trust_pickle: bool) -> dict[str, Any]:
    """torch.load the authors' file (weights_only=False) after the trust check; validate its shape."""
    path = Path(path)
    if not trust_pickle:
        raise UsageError(f"refusing to load {path}: it is a pickle, and loading a pickle runs code from the file",
                         hint=TRUST_HINT)
    if not path.exists():
        raise UsageError(f"{path} does not exist")
    import torch

    try:
        obj = torch.load(str(path), weights_only=False, map_location="cpu")
    except Exception as e:  # unpickling errors come in many classes
        raise UsageError(f"cannot load {path}: {type(e).__name__}: {e}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("responses"), list):
        raise UsageError(f"{path}: not a DDTree benchmark file (expected a dict with a \"responses\" list)")
    if not obj["responses"]:
        raise UsageError(f"{path}: \"responses\" is empty")
    for i, r in enumerate(obj["responses"]):
        if not isinstance(r, dict) or not r:
            raise UsageError(f"{path}: responses[{i}] is not a dict of methods")
    return obj


def _ids(v: Any, where: str) -> list[int]:
    """output_ids as a flat list of ints (tensor [1, n] or [n], nested list or list)."""
    if hasattr(v, "reshape") and hasattr(v, "tolist"):
        v = v.reshape(-1).tolist()
    elif isinstance(v, list) and len(v) == 1 and isinstance(v[0], list):
        v = v[0]
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
        raise UsageError(f"{where}: output_ids must be a tensor or list of token ids (integers >= 0)")
    return [int(x) for x in v]


def _accept_lengths(v: Any, where: str) -> list[int] | None:
    """acceptance_lengths as a list of integers >= 1 (a list, tuple or tensor; None when absent or empty)."""
    if hasattr(v, "reshape") and hasattr(v, "tolist"):
        v = v.reshape(-1).tolist()
    if v is None or (isinstance(v, (list, tuple)) and not v):
        return None
    ok = isinstance(v, (list, tuple)) and all(
        (isinstance(a, int) and not isinstance(a, bool)) or (isinstance(a, float) and a.is_integer()) for a in v)
    if not ok or any(a < 1 for a in v):
        raise UsageError(f"{where}: acceptance_lengths must be a list of integers >= 1 (each round counts its bonus "
                         f"token), got {str(v)[:60]}")
    return [int(a) for a in v]


@dataclass
class Response:
    """One method's output of one response, split into prompt and generated tokens."""

    prompt_ids: list[int]
    output_ids: list[int]
    accept_lengths: list[int] | None


def split_response(ns: Any, where: str) -> Response:
    ids = _ids(getattr(ns, "output_ids", None), where)
    n_in = getattr(ns, "num_input_tokens", None)
    if not isinstance(n_in, int) or not 0 < n_in <= len(ids):
        raise UsageError(f"{where}: num_input_tokens must be an integer in 1..len(output_ids)")
    return Response(ids[:n_in], ids[n_in:], _accept_lengths(getattr(ns, "acceptance_lengths", None), where))


def method_budget(name: str) -> tuple[str, int | None]:
    """Their method key -> (our method, budget): baseline -> ar, dflash, ddtree_tb512 -> (ddtree, 512)."""
    if name == "baseline":
        return "ar", None
    m = re.fullmatch(r"ddtree_tb(\d+)", name)
    if m:
        return "ddtree", int(m.group(1))
    return name, None


@dataclass
class ImportResult:
    entries: list[BaselineEntry]
    unmatched: list[int] = field(default_factory=list)     # response indices
    duplicates: list[int] = field(default_factory=list)    # responses matching an already-matched (prompt, turn)
    tau_by_method: dict[str, float] = field(default_factory=dict)
    matched_by: dict[str, int] = field(default_factory=dict)


def import_responses(obj: dict[str, Any], tokenizer: Any, prompts: list[Prompt], method: str = "baseline",
                     accept_from: str | None = None, source: str = "RUN.pt") -> ImportResult:
    """Match every response to a (prompt, turn) of the suite and build baseline entries from `method`'s outputs,
    with `accept_from`'s acceptance lengths (default: the same method's)."""
    responses = obj["responses"]
    accept_from = accept_from or method
    for i, r in enumerate(responses):
        for name in (method, accept_from):
            if name not in r:
                raise UsageError(f"{source}: responses[{i}] has no method {name!r}; it has {', '.join(sorted(r))}")

    by_ids: dict[tuple[int, ...], Prompt] = {}
    by_text: dict[str, Prompt] = {}
    for p in prompts:
        msgs = [{"role": "user", "content": p.turns[0]}]
        by_ids.setdefault(tuple(tokenizer.apply_chat_template(msgs)), p)
        by_text.setdefault(tokenizer.render(msgs), p)

    result = ImportResult([])
    found: dict[tuple[str, int], BaselineEntry] = {}
    convo: dict[tuple[str, int], tuple[Prompt, int, list[dict[str, str]] | None]] = {}  # key -> prompt, index, messages

    def accept(i: int, resp: Response, p: Prompt, turn: int, how: str, messages, ctx_method: str | None) -> None:
        if (p.prompt_id, turn) in found:
            result.duplicates.append(i)
            return
        acc = split_response(responses[i][accept_from], f"{source}: responses[{i}][{accept_from!r}]").accept_lengths
        e = BaselineEntry(p.prompt_id, turn, resp.prompt_ids, resp.output_ids, tokenizer.decode(resp.output_ids),
                          None, acc, None, {"source_index": i, "matched_by": how})
        if ctx_method is not None:
            e.extra["context_method"] = ctx_method
        found[(p.prompt_id, turn)] = e
        convo[(p.prompt_id, turn)] = (p, i, messages)
        result.matched_by[how] = result.matched_by.get(how, 0) + 1

    split = [split_response(r[method], f"{source}: responses[{i}][{method!r}]") for i, r in enumerate(responses)]
    vocab = getattr(tokenizer, "vocab_size", None)
    for i, resp in enumerate(split):
        top = max(resp.prompt_ids + resp.output_ids)
        if isinstance(vocab, int) and top >= vocab:
            raise UsageError(f"{source}: responses[{i}][{method!r}]: token id {top} is outside the tokenizer's vocabulary "
                             f"({vocab} ids)", hint="is --tokenizer the target the file was generated with?")
    pending: list[int] = []
    prev: tuple[str, int] | None = None  # the key matched by the previous response
    for i, resp in enumerate(split):
        hit = None
        p = by_ids.get(tuple(resp.prompt_ids))
        if p is not None:
            hit = (p, 0, "ids", [{"role": "user", "content": p.turns[0]}], None)
        else:
            p = by_text.get(tokenizer.decode(resp.prompt_ids, skip_special_tokens=False))
            if p is not None:
                hit = (p, 0, "text", [{"role": "user", "content": p.turns[0]}], None)
        if hit is None and prev is not None:  # rule 3: the next turn of the previous response's item
            hit = _next_turn(responses, convo[prev], prev[1], resp.prompt_ids, tokenizer, source, consecutive=True)
        if hit is None:
            pending.append(i)
            prev = None
            continue
        accept(i, resp, *hit)
        prev = (hit[0].prompt_id, hit[1])
    progress = True
    while pending and progress:  # later turns whose predecessor is elsewhere in the file: exact ids only
        progress = False
        for i in list(pending):
            for key in [k for k, (p, _, _) in convo.items() if k[1] + 1 < len(p.turns) and (k[0], k[1] + 1) not in found]:
                hit = _next_turn(responses, convo[key], key[1], split[i].prompt_ids, tokenizer, source, consecutive=False)
                if hit is not None:
                    accept(i, split[i], *hit)
                    pending.remove(i)
                    progress = True
                    break
    result.unmatched = pending

    order = {p.prompt_id: k for k, p in enumerate(prompts)}
    result.entries = sorted(found.values(), key=lambda e: (order[e.prompt_id], e.turn))
    result.tau_by_method = _tau_by_method(responses, [e.extra["source_index"] for e in result.entries], source)
    return result


def _next_turn(responses: list[dict[str, Any]], conv: tuple, turn: int, prompt_ids: list[int], tokenizer: Any,
               source: str, consecutive: bool):
    """Match `prompt_ids` as turn+1 of a matched (item, turn) (module docstring, rule 3): exact ids when the
    conversation is re-rendered with one of that response's methods' answers; when the response directly
    follows it in the file, also by the decoded prompt containing the next user turn."""
    p, index, messages = conv
    if turn + 1 >= len(p.turns):
        return None
    user = {"role": "user", "content": p.turns[turn + 1]}
    if messages is not None:
        for name in reversed(list(responses[index])):  # the authors feed the last method's answer; try it first
            answer = tokenizer.decode(split_response(responses[index][name], f"{source}: responses[{index}][{name!r}]").output_ids)
            msgs = messages + [{"role": "assistant", "content": answer}, user]
            if tokenizer.apply_chat_template(msgs) == prompt_ids:
                return (p, turn + 1, "ids", msgs, name)
    if consecutive and p.turns[turn + 1] in tokenizer.decode(prompt_ids, skip_special_tokens=False):
        return (p, turn + 1, "sequence", None, None)
    return None


def _tau_by_method(responses: list[dict[str, Any]], indices: list[int], source: str) -> dict[str, float]:
    """Mean over matched responses of per-response mean acceptance length (the authors' tau), per method."""
    from ddtree_bench.metrics import request_tau

    out: dict[str, float] = {}
    if not indices:
        return out
    for name in responses[indices[0]]:
        taus = []
        for i in indices:
            if name in responses[i]:
                t = request_tau(split_response(responses[i][name], f"{source}: responses[{i}][{name!r}]").accept_lengths)
                if t is not None:
                    taus.append(t)
        if taus:
            out[name] = sum(taus) / len(taus)
    return out


def finish_reasons(entries: list[BaselineEntry], stop_ids: list[int], max_new_tokens: int | None) -> None:
    """Fill finish_reason: "stop" when the output ends with a stop id, "length" at max_new_tokens."""
    stops = set(stop_ids)
    for e in entries:
        if e.output_ids and e.output_ids[-1] in stops:
            e.finish_reason = "stop"
        elif max_new_tokens is not None and len(e.output_ids) >= max_new_tokens:
            e.finish_reason = "length"


def resolve_tokenizer(name: str) -> tuple[Any, list[int], str]:
    """`--tokenizer`: a model directory, or the built-in names `toy` / `random` (the byte tokenizer).
    Returns (ChatTokenizer, default stop ids, a description for the header)."""
    from ddtree_bench.pair import model_dirs
    from ddtree_bench.tokenizer import ChatTokenizer, generation_stop_ids

    if name == "random":
        import tempfile

        from ddtree_bench.toy.tokenizer import IM_END, write_tokenizer

        tmp = Path(tempfile.mkdtemp(prefix="ddtree-bench-tok-"))
        write_tokenizer(tmp)
        return ChatTokenizer(tmp), [IM_END], "random (byte tokenizer)"
    target_dir, _ = model_dirs(name, None)
    if not target_dir.is_dir():
        raise UsageError(f"--tokenizer {name}: not a directory", hint="pass the target model's Hugging Face directory")
    tok = ChatTokenizer(target_dir)
    return tok, generation_stop_ids(target_dir, tok), str(target_dir)


def _drop_final_empty_rounds(entries: list[BaselineEntry], max_new_tokens: int | None) -> int:
    """The last-round rule (docs/engine-tests.md): the authors' final round, whose every token fell past
    max_new_tokens, is left out of each entry's acceptance lengths. Returns how many were dropped."""
    from ddtree_bench.engine.interface import drop_final_empty_round

    dropped = 0
    for e in entries:
        if e.accept_lengths:
            e.accept_lengths, cut = drop_final_empty_round(e.accept_lengths, max_new_tokens)
            dropped += cut
    return dropped


def _rescore_entries(entries: list[BaselineEntry], model: str, dtype: str, device: str, progress: bool) -> dict[str, Any]:
    """Fill every entry's logit gaps with the reference engine's (`--gaps-from-model`, teacher-forced);
    returns the header's `logit_gap_source`."""
    from tqdm.auto import tqdm

    from ddtree_bench.baselines.record import rescore_gaps
    from ddtree_bench.pair import load_pair

    pair = load_pair(model, None, "ar", dtype, device)
    for e in tqdm(entries, desc="re-scoring gaps", unit="turn", disable=not progress, leave=False):
        if e.prompt_ids:
            e.logit_gap = rescore_gaps(pair.engine, e.prompt_ids, e.output_ids)
    return {"model": model, "model_hash": pair.info.get("model_hash"), "dtype": dtype,
            "device": device, "how": "teacher-forced full-sequence forward of the reference engine"}


def import_baseline(pt: str | Path, trust_pickle: bool, tokenizer: str, suite: str | None = None, limit: int | None = None,
                    subset: str | None = None, method: str = "baseline", accept_from: str | None = None,
                    gaps_from_model: str | None = None, dtype: str = "float32", device: str = "cpu",
                    progress: bool = True) -> tuple[dict[str, Any], ImportResult]:
    """The whole import: load (after the trust check), match, optionally re-score gaps; (header, result).
    suite None = the file's `args.dataset`; limit None = its `args.max_samples` (else the suite's default)."""
    from ddtree_bench.baselines.record import environment_fields, template_sha256
    from ddtree_bench.engine.loading import file_hash
    from ddtree_bench.suites.prompts import load_suite

    obj = load_pt(pt, trust_pickle)
    args = obj.get("args") if isinstance(obj.get("args"), dict) else {}
    if suite is None:  # the authors' dataset key names the suite (gsm8k, mt-bench, ...)
        suite = args.get("dataset")
        if not isinstance(suite, str):
            raise UsageError(f"{pt} names no dataset in its args; pass --suite")
    n = args.get("max_samples")
    if limit is None and n is not None:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise UsageError(f"{pt}: args.max_samples must be a positive integer, got {n!r}",
                             hint="pass --limit N to say how many of the suite's items the file holds")
        limit = n  # with the zlab-paper subset rule this selects the authors' items
    tok, stop_ids, tok_desc = resolve_tokenizer(tokenizer)
    loaded = load_suite(suite, limit, subset=subset)
    prompts, info = loaded.prompts, loaded.info
    result = import_responses(obj, tok, prompts, method, accept_from, source=str(pt))
    if not result.entries:
        raise UsageError(f"none of the {len(obj['responses'])} responses in {pt} matches a prompt of suite {info.name!r}",
                         hint="check --suite (and --subset / --limit: import needs every prompt the run used) and --tokenizer")
    max_new = args.get("max_new_tokens") if isinstance(args.get("max_new_tokens"), int) else None
    finish_reasons(result.entries, stop_ids, max_new)
    dropped = _drop_final_empty_rounds(result.entries, max_new)
    gaps_info = None
    if gaps_from_model is not None:
        gaps_info = _rescore_entries(result.entries, gaps_from_model, dtype, device, progress)

    src_method, _ = method_budget(method)
    acc_method, acc_budget = method_budget(accept_from or method)
    if acc_method == "ar":  # AR rounds are all 1: no reference tau in them
        for e in result.entries:
            e.accept_lengths = None
    temperature = args.get("temperature", 0.0)
    header: dict[str, Any] = {
        "source": "import",
        "source_file": str(pt),
        "source_sha256": file_hash(Path(pt)),
        "source_method": method,
        "method": src_method,
        "temperature": float(temperature) if isinstance(temperature, (int, float)) else None,
        "model": args.get("model_name_or_path"),
        "draft": args.get("draft_name_or_path"),
        "model_hash": None,
        "draft_hash": None,
        "suite": info.name,
        "suite_info": info.to_dict(),
        "subset_rule": info.subset_rule,
        "template": info.template,
        "tokenizer": tok_desc,
        "chat_template_sha256": template_sha256(tok),
        "dtype": "bfloat16",  # the authors' benchmark.py loads both models in bf16 (ddtree-algorithm.md §6.1)
        "device": "cuda",
        "max_new_tokens": max_new,
        "stop_ids": stop_ids,
        "accept_from": accept_from or method,
        "accept_method": acc_method if acc_method != "ar" else None,
        "budget": acc_budget,
        "block_size": obj.get("block_size"),
        "target_attn_implementation": obj.get("target_attn_implementation"),
        "source_args": {k: v for k, v in args.items() if isinstance(v, (str, int, float, bool, type(None)))},
        "tau_by_method": result.tau_by_method,
        "num_responses": len(obj["responses"]),
        "num_matched": len(result.entries),
        "unmatched_responses": result.unmatched,
        "duplicate_responses": result.duplicates,
        "final_empty_rounds_dropped": dropped,  # per-round figures follow the last-round rule; tau_by_method is theirs as run
        "matched_by": result.matched_by,
        "logit_gap_source": gaps_info,
        **environment_fields(None),
    }
    return header, result
