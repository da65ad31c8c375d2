"""The human view of a `Comparison`: a per-prompt table and the totals (the JSON is `Comparison.to_json`)."""

from __future__ import annotations

from ddtree_bench.display import fmt, table
from ddtree_bench.verdict.compare import BENIGN_LENGTH_REASONS, Comparison

MAX_ROWS_ALL = 40      # above this many prompts, matching rows are summarised, not listed
CONTEXT_WIDTH = 90


def _clip(s: str | None, n: int = CONTEXT_WIDTH) -> str:
    if not s:
        return ""
    return s if len(s) <= n else s[: n - 3] + "..."


def _pct(x: float | None, sign: bool = False) -> str:
    return "-" if x is None else (f"{100 * x:+.1f}%" if sign else f"{100 * x:.1f}%")


def render(c: Comparison) -> str:
    lines = [f"compare {c.run} against {c.baseline}"]
    bi, ri = c.baseline_info, c.run_info
    budget = f" B={ri.get('budget')}" if ri.get("method") == "ddtree" else ""
    load = (f", {ri['request_rate']:g} req/s" if isinstance(ri.get("request_rate"), (int, float))
            else f", c={ri['concurrency']}" if isinstance(ri.get("concurrency"), int) and ri["concurrency"] > 1 else "")
    if load and ri.get("concurrency_honoured") is False:
        load += " (NOT honoured)"
    lines.append(f"  run: {ri.get('backend')} {ri.get('method')}{budget}, suite {ri.get('suite')}, T={ri.get('temperature')}{load}, "
                 f"{ri.get('dtype') or 'dtype not reported'}  |  baseline: {bi.get('source')} {bi.get('method')}, {bi.get('model')}, {bi.get('dtype')}, "
                 f"logit gaps {'yes' if bi.get('has_logit_gaps') else 'no'}")
    for w in c.warnings:
        lines.append(f"  warning: {w}")
    if not c.token_comparable:
        lines.append(f"  note: {c.not_comparable_reason}")
    if c.distribution is not None:
        lines.append(f"  {c.distribution.line()}")
    lines.append("")

    rows = c.prompts
    hidden = 0
    if len(rows) > MAX_ROWS_ALL:
        hidden = sum(1 for p in rows if p.kind == "match")
        rows = [p for p in rows if p.kind != "match"]
    if rows:
        body = []
        for p in rows:
            note = p.context if p.kind in ("near_tie", "divergence", "unknown") else (p.explanation or p.context)
            body.append((p.prompt_id, p.turn, p.kind + (f" ({p.reason})" if p.kind == "length_only" else ""),
                         p.first_divergence, fmt(p.gap, 3), p.baseline_len, p.output_len, _clip(note)))
        lines.append(table(body, ("prompt", "turn", "kind", "diverges at", "gap", "base len", "run len", "context")))
    if hidden:
        lines.append(f"({hidden} matching prompts not listed)")
    lines.append("")

    if c.token_comparable:
        n = len(c.prompts)
        lines.append(f"exact match {c.count('match')}/{n} ({_pct(c.exact_match_rate)}); confident divergences "
                     f"{c.count('divergence')}; near ties {c.count('near_tie')} (gap < {c.near_tie_gap:g}); unknown gap "
                     f"{c.count('unknown')}; length-only {c.count('length_only')} "
                     f"({c.count('length_only', BENIGN_LENGTH_REASONS)} truncation/EOS)")
    lines.append(f"prompt mismatches {c.count('prompt_mismatch')}; after an earlier divergence {c.count('after_divergence')}; "
                 f"errors {c.count('error')}")
    if c.missing_in_run:
        lines.append(f"{len(c.missing_in_run)} baseline prompts/turns are not in the run (e.g. {', '.join(c.missing_in_run[:3])})")
    if c.not_in_baseline:
        lines.append(f"{len(c.not_in_baseline)} run prompts/turns are not in the baseline (e.g. {', '.join(c.not_in_baseline[:3])})")
    a = c.acceptance
    if a.get("tau_baseline") is not None:
        lines.append(f"tau {fmt(a['tau_run'])} vs baseline {fmt(a['tau_baseline'])} ({_pct(a['tau_ratio'] - 1 if a['tau_ratio'] else None, sign=True)}) "
                     f"over {a['num_paired']} paired prompts; histogram TV distance {fmt(a['histogram_tv_distance'], 3)}"
                     + (f" - NOT COMPARABLE: {a['not_comparable']}" if a.get("not_comparable") else ""))
        delta = a.get("rate_by_depth_delta") or []
        shown = [f"d{d + 1} {x:+.3f}" for d, x in enumerate(delta) if d < 8]
        if shown:
            lines.append("acceptance rate by depth, run - baseline: " + "  ".join(shown))
    elif a.get("tau_run") is not None:
        lines.append(f"tau {fmt(a['tau_run'])} (the baseline has no acceptance lengths to compare with)")
    return "\n".join(lines)
