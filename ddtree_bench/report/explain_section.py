"""The report's "Acceptance gap" section: what `ddtree-bench explain` found, per run that has an explain.json.

Shows the verdict and fix, server vs reference tau and per-depth acceptance (d1..d6), the first
parting, config findings, and the variants ranked by curve distance. Knows the explain.json
format (explain/analyse.py) and the report's markup helpers (report/markup.py); nothing of engines.
"""

from __future__ import annotations

from typing import Any

from ddtree_bench.report.markup import el, fmt, join


def section_explain(data: Any) -> str:
    """'' when no run carries an explain.json."""
    blocks = []
    for p in data.points:
        ex = getattr(p, "explain", None)
        if not ex:
            continue
        v = ex.get("verdict") or {}
        parts = [el("h3", el("code", p.id), f" \u2014 {v.get('status', '?')}"), el("p", v.get("text") or "")]
        if v.get("fix"):
            parts.append(el("p", el("strong", "Fix: "), v["fix"]))
        for f in ex.get("config_findings") or []:
            parts.append(el("p", f"config {f.get('severity')}: {f.get('message')}", class_="muted"))
        srv, ref = ex.get("server") or {}, ex.get("reference") or {}
        if srv:
            depth = lambda r: " ".join(f"{x:.2f}" for x in (r or [])[:6])  # noqa: E731
            parts.append(el("p", f"server \u03c4 {fmt(srv.get('tau'))} (d1..d6: {depth(srv.get('rates_by_depth'))}) vs reference "
                                 f"\u03c4 {fmt(ref.get('tau'))} (d1..d6: {depth(ref.get('rates_by_depth'))}); distance = {ex.get('distance')}"))
        first = (ex.get("parting") or {}).get("first")
        if first:
            parts.append(el("p", f"first parting: request {first.get('prompt_id')}/{first.get('turn')}, round {first.get('round')}, "
                                 f"depth {first.get('depth')}, output token {first.get('output_index')} (id {first.get('token_id')}): "
                                 f"server accepted {first.get('a')}, reference {first.get('b')}"))
        rows = []
        for r in ex.get("variants") or []:
            if "skipped" in r:
                rows.append(el("tr", el("td", el("code", r["name"])), el("td", "skipped: " + r["skipped"], colspan="4")))
                continue
            ra = r.get("round_agreement") or {}
            rows.append(el("tr", el("td", el("code", r["name"])), el("td", fmt(r.get("tau")), class_="num"),
                           el("td", fmt(r.get("distance"), 3), class_="num"),
                           el("td", f"{ra.get('requests_identical', '-')}/{ra.get('requests', '-')}", class_="num"),
                           el("td", r.get("description") or "")))
        if rows:
            head = el("tr", *[el("th", h) for h in ("variant", "\u03c4", "distance", "identical requests", "what it changes")])
            parts.append(el("div", el("table", el("thead", head), el("tbody", *rows), class_="grid"), class_="table-wrap"))
        blocks.append(join(parts))
    if not blocks:
        return ""
    intro = el("p", "From ", el("code", "ddtree-bench explain RUN"), ": the run replayed on the reference engine under known "
               "drafter variants, ranked by how closely each reproduces the server's per-depth acceptance.", class_="muted")
    return el("section", el("h2", "Acceptance gap"), intro, *blocks, id="explain")
