"""Greedy diff of a run against a baseline, per (prompt, turn), with near-tie triage.

For each (prompt_id, turn) present in both, `kind` is one of:
  match             output token ids are identical;
  near_tie          they first differ at index i where the baseline's top-1 minus top-2 logit gap
                    is below `near_tie_gap`: a flip that floating-point effects explain (bf16,
                    batch shape, tree-verify vs one-token kernels; docs/ci-gate.md);
  divergence        they first differ where the baseline was confident (gap >= threshold): a bug;
  unknown           they differ but the baseline has no gap there (imported .pt baselines);
  length_only       one output is a strict prefix of the other; `reason` says which side and why:
                    run_truncated / baseline_truncated (hit max_new_tokens), eos_stripped (one side
                    omits the final stop token), stop_ignored (the longer one ran past a stop
                    token), early_stop (the shorter ended with neither);
  prompt_mismatch   the prompt token ids differ (or, where the run has no prompt ids, the server's
                    prompt-token count is not the baseline prompt's length): different template,
                    tokenizer or suite, so the outputs are not comparable (flagged, never diffed);
                    `prompt_check` says how each prompt was checked: "ids", "count" or None (not at all);
  after_divergence  a later turn whose prompt differs only because an earlier turn's answer
                    diverged (it carries that answer), so it cannot be compared;
  error             the run's request failed;
  sampled           T > 0 (run or baseline): outputs are equal only in distribution, so tokens are
                    not diffed; acceptance histograms and tau are compared instead, and
                    `compare_run` tests the emitted tokens against the target's tempered
                    distribution (`distribution.py`: the `distribution` section).
exact_match_rate = matches / num_prompts (every paired (prompt, turn) counts).
Acceptance: tau (metrics.acceptance_length_mean) of the run and of the baseline over the same
paired prompts, per-depth acceptance-rate deltas (run - baseline) and the histograms' total
variation distance. For a run whose server shortens its last drafts to the token budget (llama.cpp),
both sides' rounds are first put under that rule (verdict/comparable_acceptance.py;
`acceptance.definition` says which). Knows records, baselines and metrics; nothing of engines or HTTP.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ddtree_bench import defaults as D
from ddtree_bench import metrics
from ddtree_bench.baselines.file import Baseline, BaselineEntry
from ddtree_bench.errors import UsageError
from ddtree_bench.records import RequestRecord
from ddtree_bench.results import run_fact  # noqa: F401 (gate and the sweep read it from here too)
from ddtree_bench.verdict import comparable_acceptance

BENIGN_LENGTH_REASONS = ("run_truncated", "baseline_truncated", "eos_stripped")
CONTEXT_TOKENS = 8
CONTEXT_CHARS = 24


@dataclass
class PromptResult:
    prompt_id: str
    turn: int
    kind: str
    match: bool | None
    first_divergence: int | None = None
    gap: float | None = None
    baseline_len: int | None = None
    output_len: int | None = None
    context: str | None = None
    reason: str | None = None
    explanation: str | None = None
    context_ids: dict[str, Any] | None = None
    tau_run: float | None = None
    tau_baseline: float | None = None
    prompt_check: str | None = None   # how the prompt was checked: "ids" | "count" (server's token count only) | None


@dataclass
class Comparison:
    run: str
    baseline: str
    near_tie_gap: float
    token_comparable: bool
    not_comparable_reason: str | None
    prompts: list[PromptResult]
    missing_in_run: list[str] = field(default_factory=list)
    not_in_baseline: list[str] = field(default_factory=list)
    acceptance: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    run_info: dict[str, Any] = field(default_factory=dict)
    baseline_info: dict[str, Any] = field(default_factory=dict)
    distribution: Any = None   # T > 0: distribution.SamplingReport (compare_run / the gate fill it); None at T = 0

    def count(self, kind: str, reason_in: tuple[str, ...] | None = None, reason_not_in: tuple[str, ...] = ()) -> int:
        return sum(1 for p in self.prompts if p.kind == kind
                   and (reason_in is None or p.reason in reason_in) and p.reason not in reason_not_in)

    @property
    def exact_match_rate(self) -> float | None:
        if not self.token_comparable or not self.prompts:
            return None
        return self.count("match") / len(self.prompts)

    def to_json(self) -> dict[str, Any]:
        """The `compare --json` document (design.md §3 keys first, more after)."""
        tc = self.token_comparable
        near = [p.gap for p in self.prompts if p.kind == "near_tie" and p.gap is not None]
        conf = [p.gap for p in self.prompts if p.kind == "divergence" and p.gap is not None]
        return {
            "exact_match_rate": self.exact_match_rate,
            "num_prompts": len(self.prompts),
            "num_confident_divergences": self.count("divergence") if tc else None,
            "num_near_ties": self.count("near_tie") if tc else None,
            "prompts": [asdict(p) for p in self.prompts],
            "kind": "ddtree-bench-compare",
            "version": 1,
            "run": self.run,
            "baseline": self.baseline,
            "token_comparable": tc,
            "not_comparable_reason": self.not_comparable_reason,
            "near_tie_gap": self.near_tie_gap,
            "num_matches": self.count("match") if tc else None,
            "num_unknown_gap": self.count("unknown") if tc else None,
            "num_length_only": self.count("length_only") if tc else None,
            "num_length_only_benign": self.count("length_only", BENIGN_LENGTH_REASONS) if tc else None,
            "num_prompt_mismatches": self.count("prompt_mismatch"),
            "num_after_divergence": self.count("after_divergence"),
            "num_errors": self.count("error"),
            "gap_at_divergence": {"near_tie_max": max(near) if near else None, "confident_min": min(conf) if conf else None},
            "missing_in_run": self.missing_in_run,
            "not_in_baseline": self.not_in_baseline,
            "acceptance": self.acceptance,
            "warnings": self.warnings,
            "run_info": self.run_info,
            "baseline_info": self.baseline_info,
            "distribution": self.distribution.to_json() if self.distribution is not None else None,
        }


# ---------------------------------------------------------------------------- one (prompt, turn)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where a and b differ, len of the shorter if one is a prefix, None if equal."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else n


def _context(base: list[int], out: list[int], i: int, base_text: str, out_text: str) -> tuple[str, dict[str, Any]]:
    ids = {"position": i, "before": base[max(0, i - CONTEXT_TOKENS):i],
           "baseline": base[i:i + CONTEXT_TOKENS], "run": out[i:i + CONTEXT_TOKENS]}
    j = 0
    while j < min(len(base_text), len(out_text)) and base_text[j] == out_text[j]:
        j += 1
    if base_text == out_text:
        return "texts are identical (the token ids differ)", ids
    before = base_text[max(0, j - CONTEXT_CHARS):j]
    text = f"...{before!r} then baseline {base_text[j:j + CONTEXT_CHARS]!r} / run {out_text[j:j + CONTEXT_CHARS]!r}"
    return text, ids


def _length_reason(out: list[int], base: list[int], run_finish: str | None, base_finish: str | None,
                   stops: set[int]) -> tuple[str, str]:
    """Why one output is a strict prefix of the other: (reason, explanation)."""
    run_short = len(out) < len(base)
    short, long_ = (out, base) if run_short else (base, out)
    s_side, l_side = ("run", "baseline") if run_short else ("baseline", "run")
    s_finish = run_finish if run_short else base_finish
    extra = long_[len(short):]
    if short and short[-1] in stops:
        return "stop_ignored", f"the {l_side} continued past stop token {short[-1]} that ended the {s_side}"
    if extra[0] in stops and len(extra) == 1:
        return "eos_stripped", (f"the {s_side} omits the final stop token {extra[0]} that the {l_side} includes "
                                "(servers often strip it from token ids)")
    if s_finish == "length":
        return f"{s_side}_truncated", f"the {s_side} stopped at its max_new_tokens after {len(short)} tokens"
    return "early_stop", (f"the {s_side} ended after {len(short)} tokens with neither a stop token nor the length limit "
                          f"(finish_reason={s_finish})")


def compare_one(rec: RequestRecord, entry: BaselineEntry, near_tie_gap: float, stop_ids: list[int],
                earlier_diverged: bool = False, token_comparable: bool = True) -> PromptResult:
    """Classify one paired (prompt, turn); see the module docstring for the kinds."""
    r = PromptResult(rec.prompt_id, rec.turn, "match", True, baseline_len=len(entry.output_ids),
                     output_len=len(rec.output_ids) if rec.output_ids is not None else None,
                     tau_run=metrics.request_tau(rec.accept_lengths), tau_baseline=metrics.request_tau(entry.accept_lengths))
    if not rec.ok:
        r.kind, r.match, r.explanation = "error", False, rec.error
        return r
    if rec.prompt_ids is not None and entry.prompt_ids is not None:
        r.prompt_check = "ids"
    elif rec.num_prompt_tokens is not None and entry.prompt_ids is not None:
        r.prompt_check = "count"
        if rec.num_prompt_tokens != len(entry.prompt_ids) and not earlier_diverged and (token_comparable or rec.turn == 0):
            r.kind, r.match, r.reason = "prompt_mismatch", None, "num_prompt_tokens"
            r.explanation = (f"the server counted {rec.num_prompt_tokens} prompt tokens, the baseline's prompt has "
                             f"{len(entry.prompt_ids)} (the run has no prompt ids to diff): different chat template, "
                             "tokenizer or suite? Outputs not compared")
            return r
    if rec.prompt_ids is not None and entry.prompt_ids is not None and rec.prompt_ids != entry.prompt_ids:
        if earlier_diverged:
            r.kind, r.match = "after_divergence", None
            r.explanation = "an earlier turn's answer diverged, and this turn's prompt carries it: not compared"
            return r
        if not token_comparable and rec.turn > 0:
            r.kind, r.match = "sampled", None
            return r
        k = first_difference(rec.prompt_ids, entry.prompt_ids)
        r.kind, r.match, r.reason = "prompt_mismatch", None, "prompt_ids"
        r.explanation = (f"prompt token ids differ from token {k} (run {len(rec.prompt_ids)} tokens, baseline "
                         f"{len(entry.prompt_ids)}): different chat template, tokenizer or suite? Outputs not compared")
        ctx = entry.extra.get("context_method")
        if rec.turn > 0 and ctx and ctx != "baseline":
            r.explanation += f"; the baseline's turn context is the authors' {ctx!r} answer, not their AR one"
        return r
    if not token_comparable:
        r.kind, r.match = "sampled", None
        return r
    base = entry.output_ids
    if rec.output_ids is None:  # a backend that reports text only
        same = rec.output_text == entry.output_text
        r.kind, r.match = ("match", True) if same else ("unknown", False)
        r.explanation = "the run reports no token ids; compared by text" + ("" if same else ": texts differ")
        return r
    out = rec.output_ids
    i = first_difference(out, base)
    if i is None:
        return r
    r.match, r.first_divergence = False, i
    r.context, r.context_ids = _context(base, out, i, entry.output_text, rec.output_text)
    if i == min(len(out), len(base)):
        r.kind = "length_only"
        r.reason, r.explanation = _length_reason(out, base, rec.finish_reason, entry.finish_reason, set(stop_ids))
        return r
    r.gap = entry.gap_at(i)
    if r.gap is None:
        r.kind = "unknown"
        r.explanation = "the baseline has no logit gap here (imported without --gaps-from-model)"
    elif r.gap < near_tie_gap:
        r.kind = "near_tie"
        r.explanation = f"the baseline's top-1/top-2 gap was {r.gap:.3g} < {near_tie_gap:g}: expected numerics"
    else:
        r.kind = "divergence"
        r.explanation = f"the baseline was confident (gap {r.gap:.3g} >= {near_tie_gap:g}): a bug"
    return r


# ---------------------------------------------------------------------------- a whole run


def _key(k: tuple[str, int]) -> str:
    return f"{k[0]}#{k[1]}"


def acceptance_block(run_recs: list[RequestRecord], base_recs: list[RequestRecord], block_size: int) -> dict[str, Any]:
    """tau, per-depth acceptance rates and histograms of both sides over the same paired prompts."""
    has_base = any(r.accept_lengths for r in base_recs)
    if has_base:  # pair only prompts where both sides have rounds
        pairs = [(a, b) for a, b in zip(run_recs, base_recs) if a.ok and a.accept_lengths and b.accept_lengths]
        run_recs, base_recs = [a for a, _ in pairs], [b for _, b in pairs]
    run_tau, base_tau = metrics.acceptance_length_mean(run_recs), metrics.acceptance_length_mean(base_recs) if has_base else None
    run_depth = metrics.acceptance_rate_by_depth(run_recs, block_size)
    base_depth = metrics.acceptance_rate_by_depth(base_recs, block_size) if has_base else None
    run_hist = metrics.acceptance_histogram(run_recs, block_size)
    base_hist = metrics.acceptance_histogram(base_recs, block_size) if has_base else None
    out: dict[str, Any] = {
        "num_paired": len(run_recs) if has_base else None,
        "tau_run": run_tau, "tau_baseline": base_tau,
        "tau_ratio": (run_tau / base_tau) if (run_tau is not None and base_tau) else None,
        "tau_run_token_weighted": metrics.acceptance_length_token_weighted(run_recs),
        "tau_baseline_token_weighted": metrics.acceptance_length_token_weighted(base_recs) if has_base else None,
        "rate_by_depth_run": run_depth, "rate_by_depth_baseline": base_depth,
        "rate_by_depth_delta": None, "histogram_run": run_hist, "histogram_baseline": base_hist,
        "histogram_tv_distance": None,
    }
    if run_depth is not None and base_depth is not None:
        n = max(len(run_depth), len(base_depth))
        a, b = run_depth + [0.0] * (n - len(run_depth)), base_depth + [0.0] * (n - len(base_depth))
        out["rate_by_depth_delta"] = [x - y for x, y in zip(a, b)]
    if run_hist is not None and base_hist is not None:
        keys = set(run_hist) | set(base_hist)
        out["histogram_tv_distance"] = 0.5 * sum(abs(run_hist.get(k, 0.0) - base_hist.get(k, 0.0)) for k in keys)
    return out


def model_mismatch(run_info: dict[str, Any], header: dict[str, Any]) -> str | None:
    """Why the run's target is not the baseline's (both model hashes known and different), else None.
    `compare` and `gate` refuse such a pair (exit 2) unless told --allow-model-mismatch."""
    mine, theirs = run_fact(run_info, "model_hash"), header.get("model_hash")
    if mine and theirs and mine != theirs:
        return (f"the run's target {run_fact(run_info, 'model') or '?'!s} ({mine}) is not the baseline's "
                f"{header.get('model') or '?'!s} ({theirs})")
    gaps = header.get("logit_gap_source") or {}   # an import's gaps re-scored by --gaps-from-model
    if mine and isinstance(gaps, dict) and gaps.get("model_hash") and gaps["model_hash"] != mine:
        return (f"the baseline's logit gaps come from {gaps.get('model') or '?'!s} ({gaps['model_hash']}), not the "
                f"run's target {run_fact(run_info, 'model') or '?'!s} ({mine}): they cannot tell its near ties")
    return None


def acceptance_mismatch(run_info: dict[str, Any], header: dict[str, Any]) -> str | None:
    """Why the baseline's acceptance lengths are no reference for the run's (another method or budget, or greedy
    against sampled), else None: `compare` says so beside tau, `gate` skips its acceptance rules."""
    if not header.get("accept_method"):
        return None
    from ddtree_bench.run_spec import method_label as label

    spec = run_info.get("spec") or {}
    method = run_fact(run_info, "method") or spec.get("method")
    budget = run_fact(run_info, "budget") or spec.get("budget")
    b_method, b_budget = header.get("accept_method"), header.get("budget")
    if method != b_method or (method == "ddtree" and b_budget is not None and budget != b_budget):
        return f"the baseline's acceptance lengths are from {label(b_method, b_budget)}, the run is {label(method, budget)}"
    if (float(spec.get("temperature") or 0.0) < D.GREEDY_EPS) != (float(header.get("temperature") or 0.0) < D.GREEDY_EPS):
        return "the run and the baseline decode at different temperatures (tau depends on it)"
    return None


def _warnings(run_info: dict[str, Any], b: Baseline) -> list[str]:
    """Differences in setup between the run and the baseline that change what a diff means."""
    spec, h = run_info.get("spec", {}), b.header
    out = []
    variant = run_fact(run_info, "target_variant") or (spec.get("extra") or {}).get("target_variant")
    if variant and variant != "reference":
        out.append(f"FAULT INJECTION: the run's target ran under target variant {variant!r} (--target-variant), "
                   "not lossless by design")
    model_hash, dtype, stops = run_fact(run_info, "model_hash"), run_fact(run_info, "dtype"), run_fact(run_info, "stop_ids")
    if model_hash and h.get("model_hash") and model_hash != h["model_hash"]:
        out.append(f"the run's target ({model_hash}) is not the baseline's ({h['model_hash']}): "
                   "divergences may come from a different model, not a bug")
    if dtype and h.get("dtype") and dtype != h["dtype"]:
        out.append(f"run dtype {dtype} vs baseline {h['dtype']}: expect more near ties")
    if spec.get("max_new_tokens") and h.get("max_new_tokens") and spec["max_new_tokens"] != h["max_new_tokens"]:
        out.append(f"run max_new_tokens {spec['max_new_tokens']} vs baseline {h['max_new_tokens']}: expect truncated outputs")
    suite = (run_info.get("suite") or {}).get("name")
    if suite and h.get("suite") and suite != h["suite"]:
        out.append(f"run suite {suite!r} vs baseline suite {h['suite']!r}")
    if stops is not None and h.get("stop_ids") is not None and sorted(stops) != sorted(h["stop_ids"]):
        out.append(f"run stop ids {stops} vs baseline {h['stop_ids']}")
    load = run_info.get("load") or {}  # summary.json's concurrency fields (compare_run adds them)
    if load.get("concurrency_honoured") is False:
        out.append(f"the run asked for concurrency {load.get('concurrency_requested')}, which was not honoured "
                   f"({load.get('concurrency_why')}): its outputs were not produced in shared batches, so this "
                   "compare says nothing of the server's correctness under that load")
    return out


def default_near_tie_gap(baseline: Baseline) -> float:
    """The near-tie threshold for a baseline: NEAR_TIE_GAP for the fp32 reference's gaps, SERVER_NEAR_TIE_GAP
    for gaps a server returned as logprobs (source "server": bf16 numerics on both sides, docs/explain.md)."""
    return D.SERVER_NEAR_TIE_GAP if baseline.header.get("source") == "server" else D.NEAR_TIE_GAP


def compare_records(records: list[RequestRecord], baseline: Baseline, near_tie_gap: float | None = None,
                    run_info: dict[str, Any] | None = None, run_path: str = "") -> Comparison:
    """Compare a run's records with a baseline (pure: no files). near_tie_gap None = default_near_tie_gap."""
    if near_tie_gap is None:
        near_tie_gap = default_near_tie_gap(baseline)
    if not 0 <= near_tie_gap < float("inf"):   # inf would excuse every divergence as a near tie
        raise UsageError(f"--near-tie-gap must be a finite number >= 0, got {near_tie_gap!r}")
    run_info = run_info or {}
    spec = run_info.get("spec", {})
    t_run = float(spec.get("temperature") or 0.0)
    greedy_run, greedy_base = t_run < D.GREEDY_EPS, baseline.temperature < D.GREEDY_EPS
    token_comparable = greedy_run and greedy_base
    reason = None
    if not token_comparable:
        which = f"the run's temperature is {t_run:g}" if not greedy_run else f"the baseline's temperature is {baseline.temperature:g}"
        reason = (f"{which}: sampled outputs are equal to greedy decoding only in distribution, so tokens are not "
                  "diffed; compare acceptance histograms and tau instead")
    run_by_key: dict[tuple[str, int], RequestRecord] = {}
    warnings = _warnings(run_info, baseline)
    for r in records:
        if (r.prompt_id, r.turn) in run_by_key:
            warnings.append(f"the run has (prompt {r.prompt_id!r}, turn {r.turn}) twice; the first is compared")
            continue
        run_by_key[(r.prompt_id, r.turn)] = r
    base_by_key = baseline.by_key()
    paired = [e for e in baseline.entries if e.key in run_by_key]
    if not paired:
        raise UsageError(f"no (prompt, turn) of the run {run_path or '(records)'} is in the baseline {baseline.path or ''}".rstrip(),
                         hint="record the baseline on the same suite (and --subset / --limit) as the run")
    results: list[PromptResult] = []
    diverged: set[str] = set()
    for e in sorted(paired, key=lambda e: e.turn):  # turns in order, so earlier turns are classified first
        res = compare_one(run_by_key[e.key], e, near_tie_gap, baseline.stop_ids, e.prompt_id in diverged, token_comparable)
        if res.kind in ("near_tie", "divergence", "unknown", "length_only", "after_divergence"):
            diverged.add(e.prompt_id)
        results.append(res)
    order = {e.key: k for k, e in enumerate(baseline.entries)}
    results.sort(key=lambda r: order[(r.prompt_id, r.turn)])
    if all(r.kind == "prompt_mismatch" for r in results):
        raise UsageError(f"every prompt of the run differs from the baseline's ({len(results)} of {len(results)}): "
                         "the baseline was made for another suite, chat template or tokenizer",
                         hint="record a baseline with the run's --model, --suite and --subset")
    block = int(baseline.header.get("block_size") or run_fact(run_info, "block_size") or metrics.DEFAULT_BLOCK_SIZE)
    run_paired = [run_by_key[e.key] for e in paired]
    n_retok = sum(1 for r in run_paired if r.token_source == "retokenized")
    if n_retok:  # --backend openai against a server that sends text only (records.py: token_source)
        warnings.append(f"judged by re-tokenized text: {n_retok} of {len(run_paired)} run outputs are the server's text "
                        "tokenized with the local tokenizer (the server sent no token ids), so a difference can come "
                        "from tokenization and a stop token the server left out of its text shows as eos_stripped")
    base_paired = [e.as_record() for e in paired]
    n_max = spec.get("max_new_tokens")
    shorten = comparable_acceptance.shortens_drafts(run_info) and isinstance(n_max, int)
    if shorten:  # llama.cpp: both sides' rounds under its draft-shortening rule (comparable_acceptance.py)
        run_paired = comparable_acceptance.shorten_records(run_paired, n_max)
        base_paired = comparable_acceptance.shorten_records(base_paired, n_max)
    acceptance = acceptance_block(run_paired, base_paired, max(block, 2))
    acceptance["definition"] = comparable_acceptance.DEFINITION if shorten else "rounds as recorded"
    acceptance["not_comparable"] = acceptance_mismatch(run_info, baseline.header)
    h = baseline.header
    return Comparison(
        run=run_path, baseline=str(baseline.path or ""), near_tie_gap=near_tie_gap, token_comparable=token_comparable,
        not_comparable_reason=reason, prompts=results,
        missing_in_run=[_key(e.key) for e in baseline.entries if e.key not in run_by_key],
        not_in_baseline=[_key(k) for k in run_by_key if k not in base_by_key],
        acceptance=acceptance, warnings=warnings,
        run_info={**{k: spec.get(k) for k in ("backend", "model", "method", "budget", "suite", "temperature", "device", "max_new_tokens",
                                              "concurrency", "request_rate")},
                  "concurrency_honoured": (run_info.get("load") or {}).get("concurrency_honoured"),
                  "dtype": run_fact(run_info, "dtype"),
                  "token_source": "retokenized" if n_retok else next((r.token_source for r in run_paired if r.token_source), None)},
        baseline_info={"source": h.get("source"), "method": h.get("method"), "model": h.get("model"), "dtype": h.get("dtype"),
                       "suite": h.get("suite"), "temperature": baseline.temperature, "has_logit_gaps": baseline.has_gaps,
                       "accept_method": h.get("accept_method"), "budget": h.get("budget")},
    )


def compare_run(run_dir: str | Path, baseline: Baseline, near_tie_gap: float | None = None, sampling: bool = True) -> Comparison:
    """Compare a results directory (run.json + records.jsonl) with a baseline; at T > 0 (and `sampling`)
    also test the run's tokens against the target's distribution (`distribution.judge_sampling`)."""
    from ddtree_bench.results import is_run_dir, is_sweep_dir, read_records, read_run_info

    run_dir = Path(run_dir)
    if not is_run_dir(run_dir):
        hint = "pass one point: SWEEP/points/<point-id>" if is_sweep_dir(run_dir) else "pass a directory written by `ddtree-bench run`"
        raise UsageError(f"{run_dir} is not a run directory (run.json + records.jsonl)", hint=hint)
    info = read_run_info(run_dir)
    summary_path = run_dir / "summary.json"
    if summary_path.exists():  # whether the run's load was real (metrics.concurrency_summary)
        from ddtree_bench.results import read_json

        summary = read_json(summary_path)
        if isinstance(summary, dict):
            info = {**info, "load": {k: summary.get(k) for k in ("concurrency_requested", "concurrency_honoured", "concurrency_why")}}
    records = read_records(run_dir)
    c = compare_records(records, baseline, near_tie_gap, info, str(run_dir))
    if sampling:
        from ddtree_bench.verdict.distribution import judge_sampling

        c.distribution = judge_sampling(records, info, baseline)
    return c
