"""`ddtree-bench explain RUN`: why does a server accept less (or more) than z-lab's drafter would?

Steps, for a greedy DFlash/DDTree run whose target the reference engine can load:
  1. config: the drafter's config against its checkpoint and the target (config_check.check_pair),
     and, given the drafter the server was launched with, the differences (diff_configs);
  2. replay: the run's requests (the exact prompt ids it sent) on the reference engine;
  3. compare: per-depth acceptance curves (curves.rates_by_depth) and, where the server reported
     per-round lists, the first parting per request (round, depth, token);
  4. variants: every DraftVariant of the catalog (or `variants`) scored against the one reference
     decode (reuse.py: only the drafter re-runs; near ties and `full_replay` replay in full), and
     on hybrid targets the target-side variants (engine/target_variants.py, e.g. gdn-crop), each
     replayed in full with the target switched; ranked by curve distance to the server (RMS over
     depths 1..D of the rate difference);
  5. verdict: `explained` by a variant that reproduces every output when the reference does not
     (the server is not lossless: a target-side cause); `matches` (reference within
     EXPLAIN_MATCH_RMS of the server), `explained` (one variant within it and at most half the
     reference's distance), `ambiguous` (several within it, the runner-up at most
     EXPLAIN_AMBIGUOUS_RATIO x the best), else `unexplained` with the nearest variant and the
     depths where the gap is largest.
The result is one JSON-ready dict (kind "ddtree-bench-explain", version 1), written as
explain.json in the run directory unless told otherwise. Knows runs on disk, the engine and the
variants; nothing of HTTP.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ddtree_bench import defaults as D
from ddtree_bench.errors import UsageError
from ddtree_bench.explain.config_check import Finding, check_pair, diff_configs
from ddtree_bench.explain.curves import Acceptance, curve_distance, first_parting, round_agreement
from ddtree_bench.explain.replay import ReplayRequest, replay
from ddtree_bench.pair import BUILTIN
from ddtree_bench.verdict import comparable_acceptance

KIND = "ddtree-bench-explain"
# One intra-op thread while explain's engine runs on a CPU: its forwards are small (a 16-row draft
# block, a tree of <= budget + 1 rows), and with two threads on the shared 2-core VM (load ~12) the
# same replay took 12x the CPU time and 10x the wall time of one thread (docs/explain.md, Speed).
EXPLAIN_CPU_THREADS = 1
VERSION = 1
DISTANCE_DOC = "RMS over depths d = 1..D of (server rate_d - variant rate_d); rate_d = share of rounds accepting >= d drafts"

FIXES = {
    "causal": "make draft attention bidirectional inside the block (z-lab passes is_causal=False); check the draft "
              "config's is_causal / dflash_config.causal and that the attention backend honours non-causal",
    "target_layer_id_offset": "read context features from the right target layers: z-lab's target_layer_ids name "
                              "decoder-layer OUTPUTS (HF hidden_states[id + 1]); an engine that captures layer inputs must add 1",
    "context_window": "give the drafter every committed context position (the engine truncates its context)",
    "sliding_window": "use the drafter config's sliding window only on its sliding_attention layers",
    "ignore_sliding_window": "honour the drafter config's sliding_window on its sliding_attention layers",
    "mask_token_id": "feed dflash_config.mask_token_id in the mask slots",
    "block_position_offset": "place the anchor (bonus) token at the position right after the last committed token, "
                             "the masks after it",
    "draft_length": "propose block_size - 1 tokens a round (num_speculative_tokens)",
    "bonus_as_mask": "feed the bonus token, not the mask, in the block's first slot",
    "context_k_norm_layer": "norm each draft layer's context keys with that layer's own k_norm weight (a grouped "
                            "RMSNorm over [layers, ctx, heads, head_dim] that reads only the first weight row applies "
                            "layer 0's weight everywhere)",
    "context_hidden_norm": "pass the context features through hidden_norm after fc",
    "target_variant": "the TARGET side deviates, not the drafter: for gdn-crop, roll each Gated DeltaNet layer's conv "
                      "window and recurrent state back to the accepted path after a verify (keep per-node states or "
                      "replay the accepted tokens); transformers' Cache.crop only crops attention K/V "
                      "(z-lab/dflash#172, huggingface/transformers#49036)",
}


def load_server_side(run_dir: Path) -> dict[str, Any]:
    """run.json + records.jsonl (+ summary.json) of a run, checked to be something explain can use."""
    from ddtree_bench.results import is_run_dir, read_json, read_records, read_run_info, run_spec

    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise UsageError(f"run directory {run_dir} does not exist")
    if not is_run_dir(run_dir):
        raise UsageError(f"{run_dir} is not a run directory (no run.json / records.jsonl)",
                         hint="pass a directory written by `ddtree-bench run`")
    run = read_run_info(run_dir)
    spec = run_spec(run, run_dir / "run.json")
    method = spec.get("method")
    if method not in ("dflash", "ddtree"):
        raise UsageError(f"{run_dir}: method {method!r} has no acceptance to explain; explain needs a dflash or ddtree run")
    if float(spec.get("temperature") or 0.0) >= D.GREEDY_EPS:
        raise UsageError(f"{run_dir}: temperature {spec.get('temperature')} > 0; explain compares greedy runs round for round",
                         hint="re-run with --temperature 0")
    records = [r for r in read_records(run_dir / "records.jsonl") if r.ok]
    summary = read_json(run_dir / "summary.json") if (run_dir / "summary.json").exists() else {}
    return {"run": run, "spec": spec, "records": records, "summary": summary}


def _model_mismatch(run: dict[str, Any], model: str, target_dir: Path | None) -> str | None:
    """Why the reference target is not the run's (both hashes known and different), else None."""
    from ddtree_bench.engine.loading import dir_hash
    from ddtree_bench.results import run_fact

    want = run_fact(run, "model_hash")
    if not want or target_dir is None or not (Path(target_dir) / "config.json").exists():
        return None
    got = dir_hash(target_dir)
    if got == want:
        return None
    return f"the reference target {model} ({got}) is not the run's {run_fact(run, 'model') or '?'} ({want})"


def _stop_ids(run: dict[str, Any], fallback: list[int]) -> list[int]:
    for src in (run.get("backend") or {}, run.get("spec") or {}):
        s = src.get("stop_ids")
        if isinstance(s, list) and s:
            return [int(x) for x in s]
    return list(fallback)


def _reference_dirs(model: str | None, draft: str | None, spec: dict[str, Any]) -> tuple[str, str | None]:
    from ddtree_bench.pair import TOY_DIR

    model = model or spec.get("model") or D.MODEL
    draft = draft or spec.get("draft")
    if draft is None and model != "toy":
        try:
            if Path(model).resolve() == (TOY_DIR / "target").resolve():
                model = "toy"
        except OSError:
            pass
    if draft is None and model not in BUILTIN:
        raise UsageError(f"explain needs the drafter of {model}", hint="pass --draft DIR (the z-lab DFlash checkpoint the server should run)")
    return model, draft


@dataclass
class _ServerRequests:
    """What the run's records give explain: the server's acceptance and the requests to replay."""

    with_rounds: bool                    # the records carry per-request acceptance lengths
    ordered: bool                        # ... in round order (not a histogram)
    acceptance: Acceptance               # the server's, over the replayed requests
    summary_rates: list[Any] | None      # summary.json's per-depth rates (when the records have none)
    requests: list[ReplayRequest]
    max_new_tokens: int
    shortened: bool = False              # the server shortens its last drafts to the token budget (llama.cpp)

    @property
    def keys(self) -> list[tuple[str, int]]:
        return [q.key for q in self.requests]

    def comparable(self, acc: Acceptance) -> Acceptance:
        """`acc` as the server would record it: for a draft-shortening server, every request's rounds under
        comparable_acceptance.shorten_to_budget (idempotent on the server's own); else unchanged."""
        if not self.shortened:
            return acc
        from ddtree_bench.verdict.comparable_acceptance import shorten_to_budget

        return replace(acc, rounds={k: shorten_to_budget(r, self.max_new_tokens) for k, r in acc.rounds.items()})


def _config_findings(target_dir: Path | None, draft_dir: Path | None, server_draft: str | None) -> list:
    """The drafter config checks (and the served drafter's config diff, with --server-draft)."""
    findings = []
    if target_dir is not None and draft_dir is not None:
        findings += check_pair(draft_dir, target_dir)
        if server_draft is not None:
            if not (Path(server_draft) / "config.json").exists():
                raise UsageError(f"--server-draft {server_draft} has no config.json")
            findings += diff_configs(draft_dir, Path(server_draft))
            own = {f.code for f in findings}   # the served drafter's own faults (ids out of range, ...), once
            findings += [Finding(f.severity, "server_" + f.code, "the server's drafter: " + f.message, f.variant)
                         for f in check_pair(Path(server_draft), target_dir) if f.code not in own]
    return findings


def _server_requests(run_dir: Path, spec: dict[str, Any], records: list, summary: Any, limit: int | None,
                     shortened: bool = False) -> _ServerRequests:
    """The records explain can use (acceptance lengths and prompt ids; else summary.json's per-depth
    rates), the first `limit` of them. UsageError when the run has nothing to replay or compare."""
    with_rounds = [r for r in records if r.accept_lengths and r.prompt_ids]
    if limit is not None:
        with_rounds = with_rounds[:limit]
    ordered = bool(with_rounds) and all((r.accept_lengths_source or "rounds") == "rounds" for r in with_rounds)
    server = Acceptance("server", {(r.prompt_id, r.turn): list(r.accept_lengths) for r in with_rounds},
                        {(r.prompt_id, r.turn): list(r.output_ids or []) for r in with_rounds}, ordered)
    summary_rates = (summary.get("metrics") or summary).get("acceptance_rate_by_depth") if isinstance(summary, dict) else None
    if not with_rounds:
        if not records or not any(r.prompt_ids for r in records):
            raise UsageError(f"{run_dir}: no request has both prompt ids and acceptance lengths; nothing to replay",
                             hint="the server returned no prompt token ids (llama.cpp's chat endpoint keeps none): re-run "
                             "with `run --endpoint completions`, which sends the ids" if records else None)
        if not summary_rates:
            raise UsageError(f"{run_dir}: the server reported no acceptance (no accept_lengths, no per-depth rates)",
                             hint="for vLLM, launch with --per-request-spec-decode-metrics detailed")
    req_records = with_rounds or [r for r in records if r.prompt_ids][: limit or None]
    max_new = int(spec.get("max_new_tokens") or D.MAX_NEW_TOKENS)
    requests = [ReplayRequest((r.prompt_id, r.turn), list(r.prompt_ids), max_new) for r in req_records]
    sr = _ServerRequests(bool(with_rounds), ordered, server, summary_rates, requests, max_new, shortened)
    sr.acceptance = sr.comparable(server)
    return sr


def _row(v, res, sr: _ServerRequests, depth: int, s_rates: list[float], s_tau: float | None) -> dict[str, Any]:
    """One variant's row: tau, per-depth rates, distance to the server, outputs equal, round agreement."""
    keys = sr.keys
    acc = sr.comparable(res.acceptance)
    rates = acc.rates(depth, keys)
    tau = acc.tau(keys)
    return {**v.to_dict(), "tau": tau, "rates_by_depth": rates, "distance": curve_distance(s_rates, rates or []),
            "delta_tau": (tau - s_tau) if s_tau is not None and tau is not None else None,
            "outputs_equal_to_server": (sum(1 for k in keys if sr.acceptance.outputs.get(k) == acc.outputs.get(k))
                                        if sr.with_rounds else None),
            "round_agreement": round_agreement(sr.acceptance, acc, keys) if sr.ordered else None}


@dataclass
class _TargetRow:
    """A target-side variant (engine.target_variants.TargetVariant) as explain's rows name it."""

    variant: Any

    def to_dict(self) -> dict[str, Any]:
        v = self.variant
        return {"name": v.name, "changes": {"target_variant": v.name}, "description": v.doc}


def _replay_target_variant(eng, tv, sr: _ServerRequests, method: str, budget: int, stops: list[int], tick) -> Any:
    """The run's requests replayed in full with the target switched to `tv` (z-lab's drafter), then back."""
    from ddtree_bench.engine.draft_variants import REFERENCE
    from ddtree_bench.engine.target_variants import REFERENCE_TARGET, apply_target_variant

    apply_target_variant(eng.target, tv)
    try:
        res = replay(eng, sr.requests, method, budget, stops, REFERENCE, on_request=tick)
    finally:
        apply_target_variant(eng.target, REFERENCE_TARGET)
    res.acceptance.label = tv.name
    return res


def _split_variants(names: list[str] | None, is_hybrid: bool) -> tuple[list | None, list]:
    """--variants names -> (drafter variants or None for the catalog, target variants). The target
    catalog (every target variant that applies, but the reference) when `names` is None."""
    from ddtree_bench.engine.draft_variants import parse_variant

    try:
        from ddtree_bench.engine.target_variants import TARGET_VARIANTS, target_catalog
    except ImportError:  # an engine without target-side variants
        TARGET_VARIANTS, target_catalog = {}, lambda hybrid: []
    if names is None:
        return None, [v for v in target_catalog(is_hybrid) if v.name != "reference"]
    drafters, targets = [], []
    for name in names:
        tv = TARGET_VARIANTS.get(name.strip())
        if tv is not None and tv.name != "reference":
            if getattr(tv, "hybrid_only", False) and not is_hybrid:
                raise UsageError(f"target variant {tv.name!r} applies to hybrid (Gated DeltaNet) targets only")
            targets.append(tv)
            continue
        try:
            drafters.append(parse_variant(name))
        except ValueError as e:
            known = f"; target variants: {', '.join(TARGET_VARIANTS)}" if TARGET_VARIANTS else ""
            raise UsageError(str(e) + known) from None
    return drafters, targets


def _replay_variants(eng, todo: list, targets: list, sr: _ServerRequests, method: str, budget: int, stops: list[int],
                     s_rates: list[float], s_tau: float | None, progress: bool, dtype: str,
                     full_replay: bool = False) -> tuple[list[dict[str, Any]], Any]:
    """Every variant's row (or why it does not apply), drafter variants in `todo` order then the
    target variants `targets`, and the reference's replay.

    The reference is decoded first, by the real loop (replay.replay). Drafter variants are then
    scored by reuse of that decode (reuse.score_variant: only the drafter runs again; requests on a
    near tie are replayed in full), or all replayed in full with `full_replay` (the slow twin).
    Target variants change what the target commits, so each is replayed in full with the target
    switched to it (and back)."""
    from tqdm.auto import tqdm

    from ddtree_bench.engine.draft_variants import REFERENCE
    from ddtree_bench.explain import reuse

    cfg, depth, n = eng.drafter.cfg, eng.drafter.block_size - 1, len(sr.requests)
    has_sliding = any(w is not None for w in cfg.layer_window)
    bar = tqdm(total=(len(todo) + len(targets)) * n, desc="explain", unit="req", disable=not progress, leave=False)
    tick = lambda: bar.update(1)  # noqa: E731
    skipped = {v.name: v.not_applicable(cfg.num_hidden_layers, eng.target.cfg.num_hidden_layers, cfg.target_layer_ids,
                                        eng.target.cfg.vocab_size, eng.drafter.block_size, has_sliding) for v in todo}
    rows: dict[str, dict[str, Any]] = {}
    try:
        ref = next((v for v in todo if v.is_reference), REFERENCE)
        bar.set_description(f"explain {ref.name} (the reference decode)")
        ref_res = replay(eng, sr.requests, method, budget, stops, ref, on_request=tick)
        rows[ref.name] = {**_row(ref, ref_res, sr, depth, s_rates, s_tau), "scored_by": "replay"}
        runnable = [v for v in todo if not v.is_reference and not skipped[v.name]]
        refs = None
        if runnable and not full_replay:
            bar.set_description("explain: target features for reuse")
            refs = reuse.decode_references(eng.target, sr.requests, ref_res, reuse.layers_needed(eng, runnable), depth)
        margin, gap = reuse.margins(dtype)
        for v in todo:
            if v.is_reference and v.name in rows:
                continue
            bar.set_description(f"explain {v.name}")
            if skipped[v.name]:
                rows[v.name] = {**v.to_dict(), "skipped": skipped[v.name]}
                bar.update(n)
                continue
            if refs is None:
                res, row_extra = replay(eng, sr.requests, method, budget, stops, v, on_request=tick), {"scored_by": "replay"}
            else:
                sc = reuse.score_variant(eng, sr.requests, refs, method, budget, stops, v, margin, gap, on_request=tick)
                res, row_extra = sc.result, {"scored_by": "reuse", "replayed_in_full": len(sc.replayed_in_full)}
            rows[v.name] = {**_row(v, res, sr, depth, s_rates, s_tau), **row_extra}
        out = [rows[v.name] for v in todo if v.name in rows]
        for tv in targets:
            bar.set_description(f"explain {tv.name} (target variant, replayed in full)")
            res = _replay_target_variant(eng, tv, sr, method, budget, stops, tick)
            out.append({**_row(_TargetRow(tv), res, sr, depth, s_rates, s_tau), "scored_by": "replay", "side": "target"})
    finally:
        bar.close()
    return out, ref_res


def explain(run_dir: str | Path, model: str | None = None, draft: str | None = None, server_draft: str | None = None,
            variants: list[str] | None = None, limit: int | None = None, dtype: str = D.DTYPE, device: str = D.DEVICE,
            progress: bool = True, full_replay: bool = False, threads: int | None = EXPLAIN_CPU_THREADS,
            allow_model_mismatch: bool = False) -> dict[str, Any]:
    """Everything explain finds about one run, as a JSON-ready dict (see the module docstring).
    `full_replay`: replay every drafter variant in full instead of scoring it by reuse of the
    reference decode (the slow twin). `threads`: torch's intra-op threads while the engine runs on
    a CPU (None: leave torch's setting). A reference target whose hash is not the run's is refused
    (UsageError) unless `allow_model_mismatch`, then named in the config findings."""
    from ddtree_bench.engine.draft_variants import REFERENCE, catalog
    from ddtree_bench.env import environment, now_iso
    from ddtree_bench.pair import load_pair, model_dirs

    t0 = time.monotonic()
    run_dir = Path(run_dir)
    side = load_server_side(run_dir)
    run, spec, records, summary = side["run"], side["spec"], side["records"], side["summary"]
    if limit is not None and limit < 1:
        raise UsageError(f"--limit must be >= 1, got {limit}")
    if threads is not None and threads < 1:
        raise UsageError(f"--threads must be >= 1, got {threads}")
    _split_variants(variants, True)  # bad names are bad input before any model loads
    model, draft = _reference_dirs(model, draft, spec)
    target_dir, draft_dir = model_dirs(model, draft)
    findings = _config_findings(target_dir, draft_dir, server_draft)
    mismatch = _model_mismatch(run, model, target_dir)
    if mismatch and not allow_model_mismatch:
        raise UsageError(mismatch, hint="pass the run's --model, or --allow-model-mismatch to replay on this one anyway")
    if mismatch:
        findings.append(Finding("warning", "model_mismatch", mismatch + ": its acceptance is not the server's target's"))
    fatal = [f for f in findings if f.severity == "error" and not f.code.startswith("server_")]
    method, budget = spec["method"], int(spec.get("budget") or D.BUDGET)
    if str(((spec.get("extra") or {}).get("labels_from") or {}).get("source", "")).startswith("--method default"):
        from ddtree_bench.run_spec import method_label

        label = method_label(method, budget)
        findings.append(Finding("warning", "method_unlabelled", f"the run is labelled {label} by the --method default: "
                                "its server did not say what it runs, and explain replays that method (a DFlash "
                                "server's run replayed as DDTree looks 'unexplained'); re-run with the server's --method"))
    sr = _server_requests(run_dir, spec, records, summary, limit, comparable_acceptance.shortens_drafts(run))

    result: dict[str, Any] = {
        "kind": KIND, "version": VERSION, "run": str(run_dir), "created_at": now_iso(),
        "backend": (run.get("backend") or {}).get("kind") or spec.get("backend"), "url": spec.get("url"),
        "server_info": run.get("server") or (run.get("backend") or {}).get("server"),
        "method": method, "budget": budget if method == "ddtree" else None, "max_new_tokens": sr.max_new_tokens,
        "num_requests": len(sr.requests), "reference_model": model, "reference_draft": draft,
        "server_draft": server_draft, "config_findings": [f.to_dict() for f in findings],
        "distance": DISTANCE_DOC,
        "thresholds": {"match_rms": D.EXPLAIN_MATCH_RMS, "ambiguous_ratio": D.EXPLAIN_AMBIGUOUS_RATIO},
    }
    if fatal:
        result.update(variants=[], verdict={
            "status": "config_fault", "variant": fatal[0].variant,
            "text": "the drafter config does not fit its checkpoint or target: " + "; ".join(f.message for f in fatal),
            "fix": "correct the drafter's config.json (or pass the right --draft) and re-run"})
        result["wall_s"] = round(time.monotonic() - t0, 2)
        return result

    pair = load_pair(model, draft, method, dtype, device)
    eng = pair.engine
    chosen, targets = _split_variants(variants, _is_hybrid(eng.target))
    stops = _stop_ids(run, pair.stop_ids)
    block = eng.drafter.block_size
    depth = block - 1
    cfg = eng.drafter.cfg
    has_sliding = any(w is not None for w in cfg.layer_window)
    pad_like = _pad_like(target_dir, cfg.mask_token_id)
    todo = chosen if chosen is not None else catalog(cfg.num_hidden_layers, block, pad_like, has_sliding, any(cfg.layer_causal))
    if not any(v.is_reference for v in todo):
        todo = [REFERENCE] + todo

    s_rates = sr.acceptance.rates(depth) if sr.with_rounds else [float(x) for x in sr.summary_rates][:depth]
    s_tau = sr.acceptance.tau() if sr.with_rounds else (summary.get("metrics") or summary).get("acceptance_length_mean")
    result["server"] = {"tau": s_tau, "rates_by_depth": s_rates, "rounds": len(sr.acceptance.pooled()),
                        "source": ("rounds" if sr.ordered else "histogram") if sr.with_rounds else "summary"}
    result["block_size"] = block
    with _torch_threads(threads if device == "cpu" else None):
        rows, ref_res = _replay_variants(eng, todo, targets, sr, method, budget, stops, s_rates, s_tau, progress,
                                         dtype, full_replay)
    result["scoring"] = {"mode": "replay" if full_replay else "reuse", "threads": threads if device == "cpu" else None,
                         "replayed_in_full": {r["name"]: r["replayed_in_full"] for r in rows if r.get("replayed_in_full")}}

    keys = sr.keys
    ran = [r for r in rows if "skipped" not in r]
    ranked = sorted(ran, key=lambda r: (r["distance"], not r["changes"] == {})) + [r for r in rows if "skipped" in r]
    ref_row = next(r for r in ran if r["changes"] == {})
    result["reference"] = {"tau": ref_row["tau"], "rates_by_depth": ref_row["rates_by_depth"], "distance": ref_row["distance"],
                           "rounds": len(sr.comparable(ref_res.acceptance).pooled(keys)) if ref_res else None,
                           "outputs_equal_to_server": ref_row["outputs_equal_to_server"]}
    result["variants"] = ranked
    result["acceptance_definition"] = comparable_acceptance.DEFINITION if sr.shortened else "rounds as recorded"
    if sr.ordered and ref_res is not None:
        result["parting"] = _partings(sr.acceptance, replace(ref_res, acceptance=sr.comparable(ref_res.acceptance)), keys, method)
    result["depth_gap"] = _depth_gap(s_rates, ref_row["rates_by_depth"] or [])
    result["verdict"] = _verdict(result, ranked, ref_row, findings)
    result["versions"] = environment(device)["versions"]
    result["wall_s"] = round(time.monotonic() - t0, 2)
    return result


def _is_hybrid(target) -> bool:
    """A target with Gated DeltaNet layers (where the target-side variants apply)."""
    return bool(getattr(target, "is_hybrid", False)) and bool(getattr(target.cfg, "gdn_layers", ()))


@contextmanager
def _torch_threads(n: int | None):
    """torch's intra-op threads set to n for the block (None: unchanged), restored after."""
    import torch

    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _pad_like(target_dir: Path | None, mask_id: int) -> int | None:
    """The target's pad (else eos) id: the id an engine could feed by mistake in the mask slots."""
    from ddtree_bench.explain.config_check import _read

    if target_dir is None:
        return None
    tc = _read(target_dir)
    for k in ("pad_token_id", "eos_token_id"):
        v = tc.get(k)
        v = v[0] if isinstance(v, list) and v else v
        if isinstance(v, int) and v != mask_id:
            return v
    return None


def _partings(server: Acceptance, ref, keys, method: str) -> dict[str, Any]:
    per = []
    for k in keys:
        p = first_parting(k, server.rounds.get(k, []), ref.acceptance.rounds.get(k, []), server.outputs.get(k), ref.acceptance.outputs.get(k))
        d = p.to_dict()
        chains = ref.drafted.get(k) or []
        if method == "dflash" and p.round is not None and p.depth is not None and p.round < len(chains) and p.depth - 1 < len(chains[p.round]):
            d["reference_drafted"] = chains[p.round][p.depth - 1]
        per.append(d)
    parted = [p for p in per if p["round"] is not None]
    depths: dict[str, int] = {}
    for p in parted:
        if p["depth"] is not None:
            depths[str(p["depth"])] = depths.get(str(p["depth"]), 0) + 1
    server_short = sum(1 for p in parted if p["a"] is not None and p["b"] is not None and p["a"] < p["b"])
    return {"requests_parted": len(parted), "requests": len(per), "first": parted[0] if parted else None,
            "depth_histogram": depths, "server_accepted_less": server_short,
            "server_accepted_more": len(parted) - server_short, "per_request": per}


def _depth_gap(s: list[float], r: list[float]) -> dict[str, Any]:
    diffs = [(x - y) for x, y in zip(s, r)]
    if not diffs:
        return {"by_depth": [], "largest_depth": None}
    d = max(range(len(diffs)), key=lambda i: abs(diffs[i]))
    return {"by_depth": diffs, "largest_depth": d + 1, "largest": diffs[d]}


def _verdict(result: dict[str, Any], ranked: list[dict[str, Any]], ref: dict[str, Any], findings) -> dict[str, Any]:
    match = D.EXPLAIN_MATCH_RMS
    s_tau = result["server"]["tau"]
    cfg_note = ""
    named = [f for f in findings if f.variant and f.severity == "error"]
    if named:
        cfg_note = " The configs already say so: " + "; ".join(f.message for f in named) + "."
    others = [r for r in ranked if "skipped" not in r and r["changes"]]
    n, ref_equal = result.get("num_requests"), ref.get("outputs_equal_to_server")
    if ref_equal is not None and n and ref_equal < n:
        # Not lossless: no drafter variant changes greedy outputs, so one that brings back every
        # output (and the curve) is a target-side variant, and it is the cause.
        same = [r for r in others if r.get("outputs_equal_to_server") == n and r["distance"] <= match]
        if same:
            best = same[0]
            ra = best.get("round_agreement")
            rounds = f", {ra['requests_identical']}/{ra['requests']} requests round-for-round identical" if ra else ""
            return {"status": "explained", "variant": best["name"],
                    "text": f"the server's greedy outputs differ from the reference's in {n - ref_equal}/{n} requests: it is "
                            f"not lossless. The reference under '{best['name']}' ({best['description']}) reproduces every "
                            f"output{rounds} (tau {_f(best['tau'])}, curve distance {best['distance']:.3f})." + cfg_note,
                    "fix": "; ".join(FIXES[k] for k in best["changes"] if k in FIXES)}
    if ref["distance"] <= match:
        return {"status": "matches", "variant": "reference",
                "text": f"the server accepts like z-lab's drafter: tau {_f(s_tau)} vs reference {_f(ref['tau'])}, "
                        f"curve distance {ref['distance']:.3f} <= {match}." + cfg_note,
                "fix": None}
    close = [r for r in others if r["distance"] <= match and r["distance"] <= ref["distance"] / 2]
    gap = result["depth_gap"]
    where = (f" The curves part most at depth {gap['largest_depth']} ({gap['largest']:+.3f})."
             if gap.get("largest_depth") else "")
    if close:
        best = close[0]
        fix = "; ".join(FIXES[k] for k in best["changes"] if k in FIXES)
        amb = [r for r in close[1:] if r["distance"] <= best["distance"] * D.EXPLAIN_AMBIGUOUS_RATIO
               and not _rounds_decide(best, r)]
        head = (f"server tau {_f(s_tau)} vs reference {_f(ref['tau'])} (curve distance {ref['distance']:.3f}). "
                f"The reference under '{best['name']}' ({best['description']}) reproduces the server: tau "
                f"{_f(best['tau'])}, distance {best['distance']:.3f}")
        ra = best.get("round_agreement")
        if ra:
            head += f", {ra['requests_identical']}/{ra['requests']} requests round-for-round identical"
        if amb:
            return {"status": "ambiguous", "variant": best["name"], "candidates": [best["name"]] + [r["name"] for r in amb],
                    "text": head + ". Equally close: " + ", ".join(f"'{r['name']}' ({r['distance']:.3f})" for r in amb)
                            + "; tell them apart with --variants or a config diff (--server-draft)." + cfg_note,
                    "fix": fix}
        return {"status": "explained", "variant": best["name"], "text": head + "." + cfg_note, "fix": fix}
    near = others[0] if others else None
    text = (f"server tau {_f(s_tau)} vs reference {_f(ref['tau'])} (curve distance {ref['distance']:.3f}); no known "
            f"variant reproduces it." + where)
    if near:
        text += f" Nearest: '{near['name']}' (distance {near['distance']:.3f}, tau {_f(near['tau'])})."
    return {"status": "unexplained", "variant": None, "nearest": near["name"] if near else None, "text": text + cfg_note,
            "fix": "compare the engine's drafter step by step with z-lab's (docs/explain.md lists the variants ruled out)"}


def _rounds_decide(best: dict[str, Any], other: dict[str, Any]) -> bool:
    """True when round-for-round agreement separates two variants whose curves are equally close: the
    best reproduces at least half the server's rounds and the other less than half as many."""
    a, b = best.get("round_agreement") or {}, other.get("round_agreement") or {}
    sa, sb = a.get("leading_round_share"), b.get("leading_round_share")
    return sa is not None and sb is not None and sa >= 0.5 and sb < sa / 2


def _f(x: float | None) -> str:
    return "?" if x is None else f"{x:.2f}"


def format_text(res: dict[str, Any]) -> str:
    """The human-readable report of `explain`."""
    lines = [f"explain: {res['run']} ({res.get('backend')}, {res['method']}, {res['num_requests']} requests)"]
    for f in res["config_findings"]:
        lines.append(f"  config {f['severity']}: {f['message']}")
    srv = res.get("server")
    if srv:
        lines.append(f"  server    tau {_f(srv['tau'])}  rounds {srv['rounds']}  ({srv['source']})")
        ref = res["reference"]
        lines.append(f"  reference tau {_f(ref['tau'])}  rounds {ref['rounds']}  outputs equal to the server's: "
                     f"{ref['outputs_equal_to_server'] if ref['outputs_equal_to_server'] is not None else '?'}/{res['num_requests']}")
        rates = lambda r: " ".join(f"{x:.2f}" for x in (r or [])[:6])  # noqa: E731
        lines.append(f"  per-depth acceptance d1..d6: server [{rates(srv['rates_by_depth'])}]  reference [{rates(ref['rates_by_depth'])}]")
    p = res.get("parting")
    if p and p["first"]:
        f = p["first"]
        drafted = (f" (the reference drafted id {f['reference_drafted']}, {'accepted' if f['a'] < f['b'] else 'rejected'}; "
                   f"the server's draft was {'rejected' if f['a'] < f['b'] else 'accepted'})") \
            if f.get("reference_drafted") is not None and f["a"] is not None and f["b"] is not None else ""
        lines.append(f"  first parting: request {f['prompt_id']}/{f['turn']} round {f['round']} depth {f['depth']} "
                     f"(output token {f['output_index']} = id {f['token_id']}): server accepted {f['a']}, reference {f['b']}{drafted}; "
                     f"{p['requests_parted']}/{p['requests']} requests part, the server accepting less in {p['server_accepted_less']}")
    if res.get("variants"):
        lines.append(f"  {'variant':<22} {'tau':>5} {'dtau':>6} {'distance':>8}  rounds matched")
        for r in res["variants"]:
            if "skipped" in r:
                lines.append(f"  {r['name']:<22} skipped: {r['skipped']}")
                continue
            ra = r.get("round_agreement")
            m = f"{ra['requests_identical']}/{ra['requests']} req, {ra['leading_round_share']:.0%} rounds" if ra and ra["rounds"] else "-"
            dt = f"{r['delta_tau']:+.2f}" if r.get("delta_tau") is not None else "?"
            name = r["name"] + (" (target)" if r.get("side") == "target" else "")
            lines.append(f"  {name:<22} {_f(r['tau']):>5} {dt:>6} {r['distance']:>8.3f}  {m}")
    v = res["verdict"]
    lines.append(f"verdict: {v['status']}: {v['text']}")
    if v.get("fix"):
        lines.append(f"fix: {v['fix']}")
    return "\n".join(lines)
