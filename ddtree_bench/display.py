"""Small terminal tables for humans (the files on disk are the machine-readable output).

Intervals print as `estimate [low, high]` at `defaults.CI_LEVEL` (see stats.py for the methods).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ddtree_bench import defaults as D


def fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    cells = [[str(h) for h in header]] + [[fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_summary(summary: dict[str, Any]) -> str:
    """Headline numbers of one run as `key  value` lines."""
    rows = [
        ("requests (errors)", f"{summary['num_requests']} ({summary['num_errors']})"),
        ("acceptance length (mean of means)", fmt(summary.get("acceptance_length_mean"))),
        ("acceptance length (token-weighted)", fmt(summary.get("acceptance_length_token_weighted"))),
        ("output tokens", summary.get("total_output_tokens")),
        ("output throughput tok/s", fmt(summary.get("output_throughput_tok_s"), 1)),
        ("TTFT p50 / p99 ms", f"{fmt(summary['ttft_ms'].get('p50'), 1)} / {fmt(summary['ttft_ms'].get('p99'), 1)}"),
        ("TPOT p50 / p99 ms", f"{fmt(summary['tpot_ms'].get('p50'), 2)} / {fmt(summary['tpot_ms'].get('p99'), 2)}"),
    ]
    if (summary.get("concurrency_requested") or 1) > 1 or summary.get("concurrency_honoured") is False:
        rows.append(("concurrency", concurrency_text(summary)))
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(w)}  {v}" for k, v in rows)


def honoured(v: Any) -> bool | None:
    """summary.json / summary.csv `concurrency_honoured` (True, False, None, or their CSV spellings)."""
    if v is None or v == "":
        return None
    return str(v).lower() in ("true", "1", "yes")


def concurrency_text(summary: dict[str, Any]) -> str:
    """'4 requested, honoured (batches 2.7 full on average, 4 at most)', or 'NOT honoured: <why>', or unknown."""
    req = summary.get("concurrency_requested")
    h = honoured(summary.get("concurrency_honoured"))
    head = f"{req} requested, " if req is not None else ""
    if h is False:
        return head + "NOT honoured: " + str(summary.get("concurrency_why") or "the backend did not run them at once")
    fill = ""
    if isinstance(summary.get("batch_size_mean"), (int, float)):
        fill = f" (batches {summary['batch_size_mean']:.1f} full on average, {summary.get('batch_size_max')} at most)"
    if h:
        return head + "honoured" + fill
    overlap = summary.get("max_decode_overlap")
    return head + "not known to be honoured (the backend does not say)" + (
        f"; at most {overlap} requests were decoding at once" if overlap is not None else "") + fill


def with_interval(v: Any, low: Any, high: Any, digits: int = 2) -> str:
    """'1.52 [1.41, 1.63]', or the bare value when there is no interval, '-' when there is no value."""
    if not isinstance(v, (int, float)):
        return fmt(v, digits)
    s = f"{v:.{digits}f}"
    if isinstance(low, (int, float)) and isinstance(high, (int, float)):
        s += f" [{low:.{digits}f}, {high:.{digits}f}]"
    return s


def _short(v: Any) -> Any:
    return Path(v).name if isinstance(v, str) and "/" in v else v


def sweep_table(rows: list[dict[str, Any]]) -> str:
    """The sweep's closing table: one line per point, or per point over its repeats (the `repeat` = `all`
    rows) when there are repeats; budget, tau, tok/s and speedup vs AR with their intervals, TTFT/TPOT p50.
    Columns that vary across rows (backend, model, suite, load, ...) are added; `heavy` marks points
    measured under heavy machine load (noise/probe.py)."""
    if not rows:
        return "no points ran"
    agg = [r for r in rows if str(r.get("repeat")) == "all"]
    shown = agg or rows
    spec = [r for r in shown if r.get("method") != "ar"]  # AR has no drafted tokens: not a variation
    vary = [c for c in ("backend", "model", "draft", "spec_tokens", "suite", "concurrency", "request_rate", "temperature")
            + (() if agg else ("repeat",)) if len({r.get(c) for r in (spec if c in ("draft", "spec_tokens") else shown)}) > 1]
    pct = f"{100 * D.CI_LEVEL:g}%"
    tps_ci = any(r.get("output_throughput_tok_s_ci_low") is not None for r in shown)
    heavy = any(r.get("heavy_load") for r in shown)
    loaded = any(_loaded(r) for r in shown)  # batched columns: the throughput ratio, batch fill, honoured
    judged = [sfx for sfx in ("", "_vs_baseline") if any(r.get(f"correctness{sfx}") not in (None, "") for r in shown)]
    header = ["method", "budget", *vary, "tau", f"tok/s [{pct} CI]" if tps_ci else "tok/s", f"speedup [{pct} CI]",
              *(["tok/s x AR", "batch fill", "load honoured"] if loaded else []),
              "TTFT p50 ms", "TPOT p50 ms", *(["repeats"] if agg else []), *(["heavy load"] if heavy else []),
              *[{"": "greedy vs AR", "_vs_baseline": "vs baseline"}[sfx] for sfx in judged], "status"]
    body = []
    for r in shown:
        ttft = r.get("ttft_ms_p50")
        body.append([r["method"], r.get("budget"), *[_short(r.get(c)) for c in vary], r.get("acceptance_length_mean"),
                     with_interval(r.get("output_throughput_tok_s"), r.get("output_throughput_tok_s_ci_low"),
                                   r.get("output_throughput_tok_s_ci_high"), 1),
                     with_interval(r.get("speedup_vs_ar"), r.get("speedup_vs_ar_ci_low"), r.get("speedup_vs_ar_ci_high")),
                     *([r.get("throughput_ratio_vs_ar"), _fill(r), _honoured_cell(r)] if loaded else []),
                     round(ttft, 1) if isinstance(ttft, float) else ttft, r.get("tpot_ms_p50"),
                     *([r.get("repeats_ok")] if agg else []), *(["yes" if r.get("heavy_load") else ""] if heavy else []),
                     *[correctness_cell(r, sfx) for sfx in judged], r["status"]])
    out = table(body, header)
    if loaded:
        out += ("\n(tok/s x AR: output tok/s / AR's at the same load, the batched speedup; batch fill: requests per "
                "engine round, mean / max)")
        for label, why in unhonoured_loads(shown):
            out += f"\nNOT honoured ({label}): {why}. Its rows are not measurements at that load; no takeaway is drawn there."
    if judged:
        out += ("\n(greedy vs AR: prompt turns identical to the sweep's AR point / compared; a tie is a near tie "
                "(shown, not failed), DIVERGES a confident divergence by the logit-gap rule: the sweep exits 1)")
    if agg:
        out += (f"\n(over {max(int(r.get('repeats_ok') or 0) for r in agg)} repeats; one row per repeat in summary.csv. "
                f"tok/s: mean, Student t interval over repeats; speedup: paired, bootstrap over repeats and prompts)")
    else:
        out += "\n(speedup interval: paired bootstrap over prompts; tok/s needs --repeats >= 2 for an interval)"
    return out


def correctness_cell(r: dict[str, Any], suffix: str = "") -> str:
    """'16/16 same', '15/16 same, 1 tie', 'DIVERGES 2/16', 'T>0: not judged', ... (sweep/correctness.py)."""
    v = r.get(f"correctness{suffix}")
    if v in (None, ""):
        return "reference" if (r.get("method") == "ar" and not suffix) else ""

    def n(k: str) -> int:
        x = r.get(f"{k}{suffix}")
        return int(float(x)) if x not in (None, "") else 0

    same = f"{n('exact_match')}/{n('compared')} same"
    if v == "DIVERGES":
        return f"DIVERGES {n('divergences')}/{n('compared')}"
    if v == "near ties":
        return f"{same}, {n('near_ties')} tie{'s' if n('near_ties') != 1 else ''}"
    if v == "unjudged":
        return f"{same}, {n('other_diffs')} unjudged"
    if v == "not judged":
        return "not judged" + (" (T>0)" if float(r.get("temperature") or 0) > 0 else "")
    return same if v == "lossless" else str(v)


def _loaded(r: dict[str, Any]) -> bool:
    """A row measured under load: concurrency > 1 or a request rate."""
    c = r.get("concurrency")
    return r.get("request_rate") not in (None, "") or (c not in (None, "") and int(float(c)) > 1)


def _fill(r: dict[str, Any]) -> str:
    m, mx = r.get("batch_size_mean"), r.get("batch_size_max")
    if m in (None, ""):
        return "-"
    return f"{float(m):.1f} / {mx}"


def _honoured_cell(r: dict[str, Any]) -> str:
    if not _loaded(r):
        return ""
    return {True: "yes", False: "NO", None: "?"}[honoured(r.get("concurrency_honoured"))]


def unhonoured_loads(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(settings label, why) once per distinct load whose concurrency some row did not honour."""
    out: dict[str, str] = {}
    for r in rows:
        if honoured(r.get("concurrency_honoured")) is False:
            label = ", ".join(x for x in (str(r.get("backend") or ""), f"c={r.get('concurrency')}") if x)
            out.setdefault(label, str(r.get("concurrency_why") or "the backend did not run the requests at once"))
    return list(out.items())
