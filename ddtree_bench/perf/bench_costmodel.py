"""bench-engine's cost-model section at batch 1: which model it predicts with, and the predictions.

Two models (perf/costmodel.py's arithmetic): the *isolated-forward* one (the verify curve of single
timed forwards, the fast engine's draft and overhead medians from bench-engine's rounds) and the one
*calibrated on rounds as they run* (`calibrate_medians` on the fast engine's per-round stage times:
those of the end-to-end generate() calls on suite prompts when they ran, else those of bench-engine's
rounds after a random prompt, where only their stage medians are kept). Per-round means
(STATISTIC), not medians: the measured tok/s is tokens over summed round time, so it keeps the slow
rounds a busy machine adds, and a model of medians leaves them out (docs/gpu-performance.md has
the toy runs that decided it). The calibrated one is printed
whenever it has DDTree rounds; the other stays in the JSON beside it. Each budget is also predicted
with its own rounds left out (`held_out_tok_s`), the honest check of the model; the main prediction
uses every round, as one would to pick a budget. tau(B) is given (random weights: `--tau`) or measured
end to end (trained pairs). Knows nothing of engines (but the fast loop's stage names) or the CLI: dicts of
measurements in, a JSON-able dict out.
"""

from __future__ import annotations

from typing import Any

from ddtree_bench.perf.costmodel import (CostModel, Curve, RoundTimes, best, calibrate_medians, held_out_predictions,
                                         rounds_counted)
from ddtree_bench.engine.interface import ROUND_STAGES
from ddtree_bench.perf.timing import median

STATISTIC = "mean"    # costmodel.STATISTICS key the calibrated model reduces each stage's rounds with
ISOLATED = "isolated-forward"
CALIBRATED = "calibrated"


def isolated_model(curve: dict[int, float], rounds: list[dict[str, Any]], ar_ms: float | None) -> CostModel | None:
    """The verify curve of isolated forwards, the fast engine's draft median over budgets and overhead per budget."""
    tree_rounds = [r for r in rounds if r["method"] == "ddtree"]
    if not tree_rounds or not curve:
        return None
    draft_ms = median([r["fast"]["draft"] for r in tree_rounds])
    overhead = Curve({r["budget"]: r["fast"]["overhead_ms"] for r in tree_rounds})
    return CostModel(Curve(curve), draft_ms, overhead, ar_ms)


def samples_from_bench_rounds(rounds: list[dict[str, Any]], block_size: int | None) -> list[RoundTimes]:
    """bench-engine's rounds as RoundTimes: each (method, budget) one 'round' of its stage medians."""
    out = []
    for r in rounds:
        if r["method"] == "dflash" and not block_size:
            continue
        budget = {"ddtree": r["budget"], "dflash": (block_size or 1) - 1}.get(r["method"], 0)
        out.append(RoundTimes(r["method"], budget, [{k: v for k, v in r["fast"].items() if k in ROUND_STAGES}]))
    return out


def samples_from_e2e(round_log: dict[tuple[str, int], list[dict[str, float]]], block_size: int | None) -> list[RoundTimes]:
    """The end-to-end fast-engine rounds, keyed (method, budget as end_to_end passed it), as RoundTimes."""
    out = []
    for (method, budget), rounds in round_log.items():
        if method == "dflash":
            if not block_size:
                continue
            budget = block_size - 1
        elif method == "ar":
            budget = 0
        out.append(RoundTimes(method, budget, rounds))
    return out


def predictions(model: CostModel, tau: dict[int, float], budgets: list[int]) -> list[dict[str, Any]]:
    return [p.to_dict() for p in model.sweep(tau, [b for b in budgets if b in tau] or sorted(tau))]


def cost_model(curve: dict[int, float], rounds: list[dict[str, Any]], tau: dict[int, float], tau_source: str,
               budgets: list[int], ar_round_ms: float | None, block_size: int | None,
               e2e_round_log: dict[tuple[str, int], list[dict[str, float]]] | None = None,
               e2e: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The cost_model section of bench-engine's result: the calibrated model's predictions when it has
    DDTree rounds (from the end-to-end calls if given, else bench-engine's rounds), else the
    isolated-forward one's; measured tok/s beside each budget when the end-to-end runs exist."""
    isolated = isolated_model(curve, rounds, ar_round_ms)
    if e2e_round_log:
        samples, where = samples_from_e2e(e2e_round_log, block_size), "end-to-end generate() calls on suite prompts"
    else:
        samples, where = samples_from_bench_rounds(rounds, block_size), "bench-engine's rounds (their stage medians)"
    budgets_in = [b for b in budgets if b in tau] or sorted(tau)
    have_tree = any(s.method == "ddtree" and s.rounds for s in samples)
    out: dict[str, Any] = {"tau": tau, "tau_source": tau_source}
    if have_tree:
        model = calibrate_medians(samples, statistic=STATISTIC)
        out.update({"model": CALIBRATED, "calibration_rounds": rounds_counted(samples), "calibrated_on": where,
                    "statistic": STATISTIC})
        preds = predictions(model, tau, budgets)
        ddtree_budgets = {s.budget for s in samples if s.method == "ddtree"}
        if len(ddtree_budgets) > 1:   # leaving out the only budget would leave no tree overhead to predict it
            held = {p.budget: p.tok_s for p in held_out_predictions(samples, tau, [b for b in budgets_in if b in ddtree_budgets],
                                                                  statistic=STATISTIC)}
            for p in preds:
                p["held_out_tok_s"] = held.get(p["budget"])
    elif isolated is not None:
        model = isolated
        out.update({"model": ISOLATED})
        preds = predictions(model, tau, budgets)
    else:
        return {}
    out.update({"draft_ms": model.draft_ms, "ar_ms": model.t_ar, "predictions": preds,
                "best_budget": best(model.sweep(tau, budgets_in)).budget, "ar_tok_s": model.ar().tok_s})
    if isolated is not None and out["model"] != ISOLATED:
        iso = predictions(isolated, tau, budgets)
        out["isolated_forward"] = {"draft_ms": isolated.draft_ms, "ar_ms": isolated.t_ar, "predictions": iso,
                                   "best_budget": best(isolated.sweep(tau, budgets_in)).budget}
    if e2e:
        meas = {r["budget"]: r["fast"]["tok_s"] for r in e2e if r["method"] == "ddtree"}
        for p in out["predictions"]:
            p["measured_tok_s"] = meas.get(p["budget"])
        out["measured_ar_tok_s"] = next(r["fast"]["tok_s"] for r in e2e if r["method"] == "ar")
        if meas:
            out["measured_best_budget"] = max(meas, key=lambda b: (meas[b], -b))
    return out
