"""The CI verdict: rules (a YAML file) applied to a run, its baseline comparison and reference runs.

Correctness rules are hard: confident greedy divergences (T = 0), request errors, prompt
mismatches, unexplained length-only differences, divergences of unknown gap and run prompts the
baseline lacks (never judged) each have a maximum count (0 by default). Near ties are bounded:
re-checked from the run's own prefix with the reference engine where it can load the baseline's
model (`near_tie_recheck`: confirmed ones pass, diverged ones are confident divergences), and
capped per run (`max_near_ties`, 3 by default; the only guard where no re-check can run); the
near_ties check says which applied. Metric rules are soft and noise-aware: a metric (tau, tok/s,
latency percentiles) must stay within a relative tolerance of its reference, in the direction
that is worse (`higher` is better: fail below ref x (1 - tol); `lower` is better: fail above
ref x (1 + tol)). The reference is the baseline's tau over the same prompts (`against: baseline`)
or the median of `--reference-run` summaries (`against: reference`); with 2+ reference runs the
tolerance widens to max(tol, noise_k x the relative half-width of the Student-t prediction interval of
one new run, `reference_spread`, the same intervals the sweep reports).

At T > 0 the token rules do not apply; `sampling_distribution` tests the run's emitted tokens
against the target's tempered distribution (`distribution.py`, a KS test at a 1% false-alarm
rate) and says NOT JUDGED where the reference engine cannot score them.

The rules themselves (the packaged `gate_rules.yaml` and a user's file merged over it) are read and
checked by `rules.py`. Knows compare, metrics and results; nothing of engines or HTTP.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddtree_bench import defaults as D
from ddtree_bench.errors import UsageError
from ddtree_bench.verdict.compare import BENIGN_LENGTH_REASONS, Comparison, acceptance_mismatch
from ddtree_bench.verdict.near_tie_recheck import Recheck, RecheckReport
from ddtree_bench.verdict.rules import BASELINE_METRICS, MetricRule, Rules, check_number, load_rules

# ---------------------------------------------------------------------------- evaluation


@dataclass
class Check:
    name: str
    group: str              # correctness | performance
    status: str             # pass | fail | warn | skip
    message: str
    value: float | None = None
    limit: float | None = None
    kinds: tuple[str, ...] = ()   # prompt kinds this check judges (for per-prompt JUnit cases)


@dataclass
class GateResult:
    checks: list[Check]
    comparison: Comparison
    rules: Rules
    warnings: list[str] = field(default_factory=list)
    recheck: RecheckReport | None = None   # how near ties were bounded (None: the run had none)

    def recheck_of(self, p: Any) -> Recheck | None:
        return self.recheck.results.get((p.prompt_id, p.turn)) if self.recheck is not None else None

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def passed(self) -> bool:
        return not self.failed

    def prompt_failure(self, p: Any) -> str | None:
        """The failed check that judges this prompt's kind, if any (benign length-only reasons never fail)."""
        if p.kind == "length_only" and p.reason in BENIGN_LENGTH_REASONS:
            return None
        rc = self.recheck_of(p) if p.kind == "near_tie" else None
        if rc is not None and rc.status == "confirmed":
            return None
        if rc is not None and rc.status == "diverged":  # judged as what it is: a confident divergence
            return next((c.name for c in self.failed if "divergence" in c.kinds), None)
        for c in self.failed:
            if p.kind in c.kinds:
                return c.name
        return None


def _count_check(name: str, count: int, limit: int | None, what: str, kinds: tuple[str, ...], examples: list[str]) -> Check:
    if limit is None:
        return Check(name, "correctness", "pass", f"{count} {what} (no limit)", count, None, kinds)
    ok = count <= limit
    msg = f"{count} {what} (allowed {limit})"
    if not ok and examples:
        msg += ": " + ", ".join(examples[:5]) + (" ..." if len(examples) > 5 else "")
    return Check(name, "correctness", "pass" if ok else "fail", msg, count, limit, kinds)


def _examples(c: Comparison, kind: str, reasons_not: tuple[str, ...] = ()) -> list[str]:
    out = []
    for p in c.prompts:
        if p.kind == kind and p.reason not in reasons_not:
            at = f" at token {p.first_divergence}" if p.first_divergence is not None else ""
            gap = f" (gap {p.gap:.3g})" if p.gap is not None else ""
            out.append(f"{p.prompt_id} turn {p.turn}{at}{gap}")
    return out


def _near_tie_check(c: Comparison, rules: Rules, recheck: RecheckReport | None) -> Check:
    """The cap on near ties, saying which guard applied: re-checked from the run's own prefix with the
    reference engine (confirmed ones are excused, diverged ones are confident divergences, the cap
    counts the rest) or the cap alone (where the engine cannot load the baseline's model)."""
    near = [p for p in c.prompts if p.kind == "near_tie"]
    if recheck is None or recheck.guard == "cap":
        counted = near
        how = "" if not near else f"; not re-checked ({recheck.reason if recheck else 'no re-check'}): the cap is the only guard"
    else:
        counted = [p for p in near if (r := recheck.results.get((p.prompt_id, p.turn))) is None or r.status == "inconclusive"]
        how = (f"; re-checked from the run's own prefix with the reference engine: {recheck.count('confirmed')} confirmed, "
               f"{recheck.count('diverged')} diverged (judged as confident divergences), {len(counted)} inconclusive")
    examples = [f"{p.prompt_id} turn {p.turn} at token {p.first_divergence} (gap {p.gap:.3g})" for p in counted if p.gap is not None]
    chk = _count_check("near_ties", len(counted), rules.max_near_ties, "near ties that excuse the rest of their output", ("near_tie",),
                       examples)
    chk.message += how
    return chk


def _prompt_check(c: Comparison, rules: Rules) -> Check:
    """The cap on prompt mismatches, saying how the prompts were checked: by token ids, by the server's prompt-token
    count only, or not at all (a run without prompt ids or counts: skipped, never a silent pass)."""
    judged = [p for p in c.prompts if p.kind != "error"]
    how = {k: sum(1 for p in judged if p.prompt_check == k) for k in ("ids", "count", None)}
    if judged and how[None] == len(judged):
        return Check("prompt_mismatches", "correctness", "skip", "not checked: the run's records carry no prompt token ids "
                     "or counts (llama.cpp's chat endpoint returns no ids; `run --endpoint completions` sends and keeps them)",
                     kinds=("prompt_mismatch",))
    chk = _count_check("prompt_mismatches", c.count("prompt_mismatch"), rules.max_prompt_mismatches,
                       "prompts whose token ids differ from the baseline's", ("prompt_mismatch",), _examples(c, "prompt_mismatch"))
    if how["count"] or how[None]:
        chk.message += (f"; checked by token ids {how['ids']}, by the server's prompt-token count only {how['count']}, "
                        f"not at all {how[None]} of {len(judged)}")
    return chk


def correctness_checks(c: Comparison, rules: Rules, num_errors: int, recheck: RecheckReport | None = None) -> list[Check]:
    checks = [_count_check("request_errors", num_errors, rules.max_errors, "failed requests", ("error",), _examples(c, "error"))]
    checks.append(_prompt_check(c, rules))
    token_rules = [
        ("confident_divergences", "divergence", rules.max_confident_divergences, "confident divergences", ()),
        ("unknown_gap_divergences", "unknown", rules.max_unknown_gap, "divergences where the baseline has no logit gap", ()),
        ("length_only", "length_only", rules.max_length_only, "length-only differences not explained by truncation or a stripped EOS",
         BENIGN_LENGTH_REASONS),
        ("near_ties", "near_tie", rules.max_near_ties, "near ties", ()),
    ]
    for name, kind, limit, what, benign in token_rules:
        if not c.token_comparable:
            checks.append(Check(name, "correctness", "skip", f"not applicable: {c.not_comparable_reason}", kinds=(kind,)))
            continue
        if kind == "near_tie":
            checks.append(_near_tie_check(c, rules, recheck))
            continue
        n = c.count(kind, reason_not_in=benign)
        examples = _examples(c, kind, benign)
        if kind == "divergence" and recheck is not None:  # a near tie whose re-check diverged is a confident divergence
            late = [(p, r) for p in c.prompts if p.kind == "near_tie" and (r := recheck.results.get((p.prompt_id, p.turn)))
                    and r.status == "diverged"]
            n += len(late)
            examples += [f"{p.prompt_id} turn {p.turn} at token {r.position} after a near tie at {p.first_divergence}"
                         + (f" ({r.gap:.3g} below the top-1)" if r.gap is not None else "") for p, r in late]
        checks.append(_count_check(name, n, limit, what, (kind,), examples))
    if rules.min_exact_match_rate is not None:
        rate = c.exact_match_rate
        if rate is None:
            checks.append(Check("exact_match_rate", "correctness", "skip", f"not applicable: {c.not_comparable_reason}"))
        else:
            ok = rate >= rules.min_exact_match_rate
            checks.append(Check("exact_match_rate", "correctness", "pass" if ok else "fail",
                                f"{rate:.1%} of prompts match exactly (required {rules.min_exact_match_rate:.1%})",
                                rate, rules.min_exact_match_rate))
    sampling = _sampling_check(c, rules)
    if sampling is not None:
        checks.append(sampling)
    if c.missing_in_run:
        checks.append(Check("coverage", "correctness", "warn",
                            f"{len(c.missing_in_run)} baseline prompts/turns are not in the run (not judged)"))
    checks.append(_unjudged_check(c, rules))
    return checks


def _sampling_check(c: Comparison, rules: Rules) -> Check | None:
    """T > 0: the run's pooled randomised PIT u must look uniform (`distribution.py`): fail when the KS
    p-value is below `sampling_alpha`; where the reference engine could not score the run, say NOT
    JUDGED (a warning, or a failure with `sampling_not_judged: fail`). None at T = 0 (the token rules judge)."""
    temperature = float(c.run_info.get("temperature") or 0.0)
    if temperature < D.GREEDY_EPS:
        return None
    name = "sampling_distribution"
    if not rules.sampling_distribution:
        return Check(name, "correctness", "skip", "off (correctness.sampling_distribution: false): the run's sampling is not judged")
    d = c.distribution
    if d is None or not d.judged:
        why = d.reason if d is not None else "not scored"
        return Check(name, "correctness", rules.sampling_not_judged, f"NOT JUDGED: {why}")
    ok = d.p_value >= rules.sampling_alpha
    msg = (f"KS test of the randomised PIT u over {d.num_tokens} tokens of {d.num_requests} requests at T={d.temperature:g}"
           + (f", top_p={d.top_p:g}" if d.top_p < 1 else "")
           + f": D = {d.statistic:.4f}, p = {d.p_value:.3g} ({'>=' if ok else '<'} false-alarm rate {rules.sampling_alpha:g}); "
           f"mean u {d.mean_u:.3f}")
    if not ok:
        msg += ("; u skewed low: the server samples greedily or too cold for its label" if d.skew == "low"
                else "; u skewed high: the server samples too hot, ignores top-p, or samples from another distribution "
                     "than the target's (a wrong model, a state or cache bug)")
    return Check(name, "correctness", "pass" if ok else "fail", msg, d.p_value, rules.sampling_alpha)


def _unjudged_check(c: Comparison, rules: Rules) -> Check:
    """Run prompts/turns the baseline does not have were never judged: a warning at least, a failure
    beyond `max_unjudged_prompts` (default 0: record the baseline on the run's suite and --limit)."""
    n, limit = len(c.not_in_baseline), rules.max_unjudged_prompts
    ex = ", ".join(c.not_in_baseline[:5]) + (" ..." if n > 5 else "")
    what = f"{n} of the run's prompts/turns are not in the baseline and were not judged" + (f": {ex}" if n else "")
    if n == 0:
        return Check("unjudged_prompts", "correctness", "pass", "every run prompt/turn is in the baseline", 0, limit)
    if limit is not None and n > limit:
        return Check("unjudged_prompts", "correctness", "fail", f"{what} (allowed {limit})", n, limit)
    return Check("unjudged_prompts", "correctness", "warn", what + (f" (allowed {limit})" if limit is not None else " (no limit)"),
                 n, limit)


def _get(summary: dict[str, Any], path: str) -> float | None:
    v: Any = summary
    for part in path.split("."):
        v = v.get(part) if isinstance(v, dict) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def judge(rule: MetricRule, value: float | None, ref: float | None, spread: float | None, ref_desc: str) -> Check:
    """One direction-aware, noise-widened comparison of `value` with `ref`."""
    if value is None or ref is None or ref == 0:
        return Check(rule.label, "performance", "skip", f"no value for {rule.metric} ({'run' if value is None else 'reference'})")
    tol = rule.tolerance
    if spread is not None and rule.noise_k > 0:
        tol = max(tol, rule.noise_k * spread)
    if rule.direction == "higher":
        limit, ok, bound = ref * (1 - tol), value >= ref * (1 - tol), "at least"
    else:
        limit, ok, bound = ref * (1 + tol), value <= ref * (1 + tol), "at most"
    widened = f", widened by noise {spread:.1%}" if (spread is not None and tol > rule.tolerance) else ""
    msg = (f"{rule.metric} {value:.4g} vs {ref_desc} {ref:.4g} ({value / ref - 1:+.1%}); needs {bound} {limit:.4g} "
           f"(tolerance {tol:.1%}{widened})")
    status = "pass" if ok else ("fail" if rule.severity == "fail" else "warn")
    return Check(rule.label, "performance", status, msg, value, limit)


def _baseline_rule(rule: MetricRule, c: Comparison, run_info: dict[str, Any], base_header: dict[str, Any]) -> Check:
    a = c.acceptance
    ref = a.get("tau_baseline" if rule.metric == "acceptance_length_mean" else "tau_baseline_token_weighted")
    if ref is None:
        return Check(rule.label, "performance", "skip",
                     "the baseline has no acceptance lengths (record it with --accept-method, or import with --accept-from)")
    mismatch = acceptance_mismatch(run_info, base_header)
    if mismatch:
        return Check(rule.label, "performance", "skip", mismatch)
    spread = None
    taus = [p.tau_run for p in c.prompts if p.tau_run is not None]
    if rule.noise_k > 0 and len(taus) >= 2:  # tau is a mean over prompts: its standard error, relative
        spread = statistics.stdev(taus) / len(taus) ** 0.5 / ref
    return judge(rule, a.get(BASELINE_METRICS[rule.metric]), ref, spread, f"baseline ({a.get('num_paired')} paired prompts)")


def reference_spread(values: list[float]) -> float | None:
    """Relative half-width of the Student-t prediction interval for one new run, from 2+ reference runs,
    at the sweep's interval level (`D.CI_LEVEL`, `stats.t_quantile`): t(1 - (1 - level)/2, n - 1) · s ·
    sqrt(1 + 1/n) / mean. The same t machinery as the sweep's tok/s intervals, widened from "where is
    the mean" to "where may one more run fall". None for fewer than 2 runs or a zero mean."""
    from ddtree_bench import defaults as D
    from ddtree_bench.stats import t_quantile

    n = len(values)
    if n < 2 or not statistics.mean(values):
        return None
    t = t_quantile(1 - (1 - D.CI_LEVEL) / 2, n - 1)
    return t * statistics.stdev(values) * (1 + 1 / n) ** 0.5 / abs(statistics.mean(values))


def _reference_rule(rule: MetricRule, run_summary: dict[str, Any] | None, refs: list[dict[str, Any]]) -> Check:
    if not refs:
        return Check(rule.label, "performance", "skip", "no --reference-run given")
    if run_summary is None:
        return Check(rule.label, "performance", "skip", "the run has no summary.json (every request failed)")
    values = [v for r in refs if (v := _get(r, rule.metric)) is not None]
    if not values:
        return Check(rule.label, "performance", "skip", f"the reference runs have no {rule.metric}")
    spread = reference_spread(values)
    desc = "reference" if len(values) == 1 else f"reference median of {len(values)}"
    return judge(rule, _get(run_summary, rule.metric), statistics.median(values), spread, desc)


SPEC_KEYS = ("backend", "model", "method", "budget", "suite", "limit", "max_new_tokens", "temperature", "dtype", "device",
             "concurrency", "request_rate")


def evaluate(comparison: Comparison, rules: Rules, num_errors: int, run_info: dict[str, Any],
             run_summary: dict[str, Any] | None, references: list[tuple[str, dict[str, Any], dict[str, Any]]],
             base_header: dict[str, Any], recheck: RecheckReport | None = None) -> GateResult:
    """All checks. `references` = [(path, run.json, summary.json)] of the reference runs; `recheck`
    the near-tie re-check (`near_tie_recheck.recheck_near_ties`), None when there was none."""
    spec = run_info.get("spec", {})
    checks = correctness_checks(comparison, rules, num_errors, recheck)
    for rule in rules.metrics:
        if rule.against == "baseline":
            checks.append(_baseline_rule(rule, comparison, run_info, base_header))
        else:
            checks.append(_reference_rule(rule, run_summary, [s for _, _, s in references]))
    warnings = list(comparison.warnings)
    for path, info, _ in references:
        rspec = info.get("spec", {})
        diff = [f"{k} {rspec.get(k)!r} vs {spec.get(k)!r}" for k in SPEC_KEYS if rspec.get(k) != spec.get(k)]
        if diff:
            warnings.append(f"reference run {path} differs from the run: {', '.join(diff)}")
    return GateResult(checks, comparison, rules, warnings, recheck)


def run_gate(results: str | Path, baseline_path: str | Path, rules_path: str | Path | None = None,
             reference_runs: list[str | Path] | None = None, near_tie_gap: float | None = None) -> GateResult:
    """Read everything (exit-2 errors first), compare, and apply the rules."""
    from ddtree_bench.baselines.file import read_baseline
    from ddtree_bench.verdict.compare import compare_records
    from ddtree_bench.verdict.near_tie_recheck import recheck_near_ties
    from ddtree_bench.results import is_run_dir, read_json, read_records, read_run_info

    rules = load_rules(rules_path)
    if near_tie_gap is not None:
        rules.near_tie_gap = float(check_number(near_tie_gap, "--near-tie-gap", allow_null=False))
        rules.near_tie_gap_from_baseline = False
    baseline = read_baseline(baseline_path)
    results = Path(results)
    if not is_run_dir(results):
        from ddtree_bench.results import is_sweep_dir

        raise UsageError(f"{results} is not a run directory (run.json + records.jsonl)",
                         hint="gate one point: SWEEP/points/<point-id>" if is_sweep_dir(results) else
                         "pass a directory written by `ddtree-bench run`")
    refs = []
    for ref in reference_runs or []:
        ref = Path(ref)
        if not is_run_dir(ref) or not (ref / "summary.json").exists():
            raise UsageError(f"--reference-run {ref} is not a finished run directory (run.json + records.jsonl + summary.json)")
        if ref.resolve() == results.resolve():
            raise UsageError(f"--reference-run {ref} is the run being gated: it cannot be its own reference",
                             hint="pass an earlier run of the same deployment (repeat the flag for noise-aware tolerances)")
        refs.append((str(ref), read_run_info(ref), read_json(ref / "summary.json")))
    info = read_run_info(results)
    records = read_records(results)
    summary = read_json(results / "summary.json") if (results / "summary.json").exists() else None
    # threshold null everywhere: the same default `compare` uses for this baseline (server logprob gaps differ)
    c = compare_records(records, baseline, None if rules.near_tie_gap_from_baseline else rules.near_tie_gap, info, str(results))
    rules.near_tie_gap = c.near_tie_gap
    recheck = recheck_near_ties(c, records, baseline, rules.recheck_near_ties) if c.token_comparable else None
    if rules.sampling_distribution:  # T > 0 only (None otherwise): the distribution verdict
        from ddtree_bench.verdict.distribution import judge_sampling

        c.distribution = judge_sampling(records, info, baseline)
    return evaluate(c, rules, sum(1 for r in records if not r.ok), info, summary, refs, baseline.header, recheck)
