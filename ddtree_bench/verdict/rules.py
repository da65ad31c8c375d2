"""The gate's rules: the packaged defaults (`gate_rules.yaml`, beside this file) with a user's rules
file merged over them, checked into `Rules` and `MetricRule`s.

A missing key keeps the default; a `metrics` list replaces the default list. Unknown keys, a wrong
`version`, negative counts and unknown metrics are `UsageError`s that name the file and the key.
A metric name is a summary key (`acceptance_length_mean`, `output_throughput_tok_s`, ...) or a
latency percentile (`ttft_ms.p99`); its `direction` (which way is better) defaults from the name.
Knows the rules' YAML; nothing of runs, baselines or how a rule is judged (`gate.py`).
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddtree_bench import defaults as D
from ddtree_bench.errors import UsageError
from ddtree_bench.verdict.distribution import FALSE_ALARM_RATE

DEFAULT_RULES = Path(__file__).resolve().parent / "gate_rules.yaml"
COUNT_RULES = ("max_confident_divergences", "max_errors", "max_prompt_mismatches", "max_length_only",
               "max_unknown_gap", "max_near_ties", "max_unjudged_prompts")
CORRECTNESS_KEYS = ("near_tie_gap", *COUNT_RULES, "min_exact_match_rate", "recheck_near_ties", "sampling_distribution",
                    "sampling_alpha", "sampling_not_judged")
NOT_JUDGED = ("warn", "fail")   # what an unjudged sampling_distribution rule does to the verdict
METRIC_KEYS = ("metric", "against", "direction", "tolerance", "noise_k", "severity", "name")
BASELINE_METRICS = {"acceptance_length_mean": "tau_run", "acceptance_length_token_weighted": "tau_run_token_weighted"}
NATURAL_DIRECTION = {"acceptance_length_mean": "higher", "acceptance_length_token_weighted": "higher",
                     "output_throughput_tok_s": "higher", "request_throughput_req_s": "higher"}
LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


@dataclass
class MetricRule:
    metric: str
    against: str             # baseline | reference
    direction: str           # higher | lower (is better)
    tolerance: float         # relative
    noise_k: float = 0.0
    severity: str = "fail"   # fail | warn
    name: str | None = None

    @property
    def label(self) -> str:
        return self.name or f"{self.metric} vs {self.against}"


@dataclass
class Rules:
    near_tie_gap: float
    max_confident_divergences: int | None
    max_errors: int | None
    max_prompt_mismatches: int | None
    max_length_only: int | None
    max_unknown_gap: int | None
    max_near_ties: int | None          # near ties the re-check did not confirm (all of them where it cannot run)
    min_exact_match_rate: float | None
    metrics: list[MetricRule]
    source: str = ""
    max_unjudged_prompts: int | None = 0   # run prompts/turns absent from the baseline (never judged)
    near_tie_gap_from_baseline: bool = False  # near_tie_gap: null = compare's default for the baseline's source
    recheck_near_ties: bool = True          # re-check near ties from the run's prefix where the model loads
    sampling_distribution: bool = True      # T > 0: test the emitted tokens against the target's distribution
    sampling_alpha: float = FALSE_ALARM_RATE  # its false-alarm rate (gate_rules.yaml: null = this default)
    sampling_not_judged: str = "warn"       # where the reference cannot score the run: warn | fail


def _read_yaml(path: Path) -> dict[str, Any]:
    from ddtree_bench.yaml_mapping import read_yaml_mapping

    if not path.exists():
        raise UsageError(f"rules file {path} does not exist")
    obj = read_yaml_mapping(path, str(path), "a mapping with correctness: and metrics:")
    unknown = set(obj) - {"version", "correctness", "metrics"}
    if unknown:
        raise UsageError(f"{path}: unknown key {sorted(unknown)[0]!r}; expected version, correctness, metrics")
    if obj.get("version", 1) != 1:
        raise UsageError(f"{path}: unsupported rules version {obj.get('version')!r} (this ddtree-bench reads 1)")
    return obj


def check_number(v: Any, where: str, integer: bool = False, allow_null: bool = True) -> Any:
    """`v` as a count or number >= 0 (or None where `allow_null`); UsageError naming `where` otherwise."""
    if v is None and allow_null:
        return None
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    if not ok or isinstance(v, bool) or not math.isfinite(v) or v < 0:   # .nan / .inf in YAML too
        raise UsageError(f"{where} must be {'an integer' if integer else 'a number'} >= 0{' or null' if allow_null else ''}, got {v!r}")
    return v


def known_metric(name: str) -> bool:
    head, _, tail = name.partition(".")
    if head in LATENCIES:
        return tail in ("mean", "p50", "p90", "p99", "max")
    return not tail and head in (*NATURAL_DIRECTION, "duration_s", "num_errors")


def _metric_rule(obj: Any, where: str) -> MetricRule:
    if not isinstance(obj, dict):
        raise UsageError(f"{where}: expected a mapping with metric, against, tolerance")
    unknown = set(obj) - set(METRIC_KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown key {sorted(unknown)[0]!r}; expected {', '.join(METRIC_KEYS)}")
    metric = obj.get("metric")
    if not isinstance(metric, str) or not known_metric(metric):
        raise UsageError(f"{where}: unknown metric {metric!r}",
                         hint=f"use {', '.join(NATURAL_DIRECTION)} or {'|'.join(LATENCIES)}.mean|p50|p90|p99|max")
    against = obj.get("against", "reference")
    if against not in ("baseline", "reference"):
        raise UsageError(f"{where}: against must be baseline or reference, got {against!r}")
    if against == "baseline" and metric not in BASELINE_METRICS:
        raise UsageError(f"{where}: a baseline carries only acceptance lengths; against: baseline works for "
                         f"{', '.join(BASELINE_METRICS)}, not {metric}")
    direction = obj.get("direction", NATURAL_DIRECTION.get(metric, "lower" if metric.split(".")[0] in LATENCIES else None))
    if direction not in ("higher", "lower"):
        raise UsageError(f"{where}: direction must be higher or lower (which is better), got {direction!r}")
    tol = check_number(obj.get("tolerance"), f"{where}: tolerance", allow_null=False)
    noise_k = check_number(obj.get("noise_k", 0.0), f"{where}: noise_k", allow_null=False)
    severity = obj.get("severity", "fail")
    if severity not in ("fail", "warn"):
        raise UsageError(f"{where}: severity must be fail or warn, got {severity!r}")
    name = obj.get("name")
    if name is not None and not isinstance(name, str):
        raise UsageError(f"{where}: name must be a string")
    return MetricRule(metric, against, direction, float(tol), float(noise_k), severity, name)


def load_rules(path: str | Path | None = None) -> Rules:
    """The packaged defaults, with `path`'s keys merged over them."""
    base = _read_yaml(DEFAULT_RULES)
    user = _read_yaml(Path(path)) if path is not None else {}
    where = str(path) if path is not None else str(DEFAULT_RULES)
    corr = dict(base.get("correctness") or {})
    user_corr = user.get("correctness") or {}
    if not isinstance(user_corr, dict):
        raise UsageError(f"{where}: correctness must be a mapping")
    unknown = set(user_corr) - set(CORRECTNESS_KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown key correctness.{sorted(unknown)[0]}; expected {', '.join(CORRECTNESS_KEYS)}")
    corr.update(user_corr)
    metrics_list = user["metrics"] if "metrics" in user else base.get("metrics")
    if metrics_list is None:
        metrics_list = []
    if not isinstance(metrics_list, list):
        raise UsageError(f"{where}: metrics must be a list")
    kw = {k: check_number(corr.get(k), f"{where}: correctness.{k}", integer=True) for k in COUNT_RULES}
    gap = check_number(corr.get("near_tie_gap"), f"{where}: correctness.near_tie_gap")
    rate = check_number(corr.get("min_exact_match_rate"), f"{where}: correctness.min_exact_match_rate")
    if rate is not None and rate > 1:
        raise UsageError(f"{where}: correctness.min_exact_match_rate must be in [0, 1], got {rate}")
    recheck = corr.get("recheck_near_ties", True)
    if not isinstance(recheck, bool):
        raise UsageError(f"{where}: correctness.recheck_near_ties must be true or false, got {recheck!r}")
    sampling = corr.get("sampling_distribution", True)
    if not isinstance(sampling, bool):
        raise UsageError(f"{where}: correctness.sampling_distribution must be true or false, got {sampling!r}")
    alpha = check_number(corr.get("sampling_alpha"), f"{where}: correctness.sampling_alpha")
    if alpha is not None and not 0 < alpha < 1:
        raise UsageError(f"{where}: correctness.sampling_alpha must be in (0, 1), got {alpha}")
    not_judged = corr.get("sampling_not_judged", "warn")
    if not_judged not in NOT_JUDGED:
        raise UsageError(f"{where}: correctness.sampling_not_judged must be warn or fail, got {not_judged!r}")
    return Rules(near_tie_gap=D.NEAR_TIE_GAP if gap is None else float(gap), min_exact_match_rate=rate,
                 metrics=[_metric_rule(m, f"{where}: metrics[{i}]") for i, m in enumerate(metrics_list)],
                 source=where, recheck_near_ties=recheck, near_tie_gap_from_baseline=gap is None,
                 sampling_distribution=sampling, sampling_alpha=FALSE_ALARM_RATE if alpha is None else float(alpha),
                 sampling_not_judged=not_judged, **kw)
