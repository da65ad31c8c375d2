"""The report's figures: matplotlib (no pyplot, no GUI) -> SVG -> `data:` URI, one function per plot.

Each `fig_*` function takes the loaded `ReportData` and returns a `Figure` (id, title, caption that
says how to read it, the embedded image) or None when its data is absent — e.g. the curves against
budget need at least two DDTree budgets, the latency curves at least two load levels, the stage
split an engine that reports `stage_ms`. Axes carry units; budgets use a log2 x axis.

SVGs are embedded as `data:image/svg+xml;base64` URIs inside <img>, so each figure's internal ids
cannot clash with the page's, text is drawn as paths (no fonts to fetch), and nothing refers to
the network; the DOCTYPE and RDF metadata matplotlib writes (which name w3.org / purl.org URLs)
are removed. Output is deterministic (fixed `svg.hashsalt`, no date).

This module knows nothing of HTML beyond producing the URI, and reads numbers only from `Point`s.
"""

from __future__ import annotations

import base64
import io
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

from ddtree_bench.report.data import Point, ReportData

STAGE_ORDER = ("prefill", "draft", "tree_build", "verify", "commit")
STAGE_COLOURS = {"prefill": "#9e9e9e", "draft": "#4c72b0", "tree_build": "#dd8452", "verify": "#55a868", "commit": "#c44e52"}
MAX_PANELS = 16
MAX_DEPTH_CURVES = 12   # lines in the acceptance-by-depth chart before it stops being readable
MAX_LATENCY_CURVES = 10  # configurations in the latency-vs-load charts
MAX_BARS = 32
RC = {
    "svg.hashsalt": "ddtree-bench-report",
    "svg.fonttype": "path",
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "figure.dpi": 100,
}


@dataclass
class Figure:
    id: str          # element id in the page (fixed, safe: [a-z-]+)
    title: str
    caption: str     # how to read it (plain text, escaped by the renderer)
    data_uri: str    # data:image/svg+xml;base64,...
    alt: str


# ---------------------------------------------------------------------------- helpers


def _new(nrows: int = 1, ncols: int = 1, w: float = 8.0, h: float = 3.4, **kw: Any):
    from matplotlib.figure import Figure as MplFigure

    fig = MplFigure(figsize=(w, h), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def _to_uri(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    svg = buf.getvalue().decode("utf-8")
    svg = re.sub(r"<!DOCTYPE[^>]*>\s*", "", svg)
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.S)
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def _budget_axis(ax, budgets: list[int]) -> None:
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(budgets))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(b) for b in budgets])
    ax.set_xlabel("tree budget B (nodes, log\u2082 scale)")


def _load_axis(ax, values: list[float], label: str) -> None:
    from matplotlib.ticker import FixedLocator, NullLocator

    if min(values) > 0 and max(values) / min(values) >= 4:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_locator(NullLocator())
        label += ", log\u2082 scale"
    ax.xaxis.set_major_locator(FixedLocator(values))
    ax.set_xticklabels([f"{v:g}" for v in values])
    ax.set_xlabel(label)


def _ylim_from_zero(ax) -> None:
    """y from 0 to 10% above the highest line, so no marker sits on the frame."""
    top = max((max(ln.get_ydata(), default=0) for ln in ax.get_lines()), default=1.0)
    ax.set_ylim(0, max(float(top), 1e-9) * 1.1)


def _percent_log_ticks(ax) -> None:
    """Ticks at 1-2-5 steps labelled as percentages, for a log y axis holding percentages."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    ys = [y for ln in ax.get_lines() for y in ln.get_ydata() if y > 0]
    if not ys:
        return
    nice = [m * 10.0 ** e for e in range(-4, 3) for m in (1, 2, 5)]
    lo = max([v for v in nice if v <= min(ys)], default=nice[0])
    hi = min([v for v in nice if v >= max(ys)], default=nice[-1])
    ax.set_ylim(lo / 1.15, hi * 1.15)
    ax.yaxis.set_major_locator(FixedLocator([v for v in nice if lo <= v <= hi]))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}%"))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_minor_formatter(NullFormatter())


def _groups(points: list[Point]) -> tuple[dict[str, list[Point]], bool]:
    """Points by suite, and by model, backend and temperature where the points hold several of each (a curve
    never averages two deployments' points); bool: more than one group."""
    many = lambda get: len({get(p) for p in points}) > 1  # noqa: E731
    models, backends, temps = many(lambda p: p.model), many(lambda p: str(p.spec.get("backend"))), many(lambda p: p.temperature)
    out: dict[str, list[Point]] = defaultdict(list)
    for p in points:
        key = ", ".join([*([p.model_name] if models else []), *([str(p.spec.get("backend"))] if backends else []), p.suite,
                         *([f"T={p.temperature:g}"] if temps else [])])
        out[key].append(p)
    return dict(out), len(out) > 1


def _shown(most: int, total: int) -> str:
    """The caption's note when a figure draws only the first `most` of `total` configurations."""
    return f" Showing the first {most} of {total} configurations (the headline table has them all)." if total > most else ""


def _mean(vals: list[float | None]) -> float | None:
    v = [x for x in vals if x is not None]
    return sum(v) / len(v) if v else None


def _ddtree_budgets(points: list[Point]) -> list[int]:
    return sorted({p.budget for p in points if p.method == "ddtree" and p.budget is not None})


def _colours(n: int, cmap: str = "tab10") -> list[Any]:
    from matplotlib import colormaps

    if cmap == "tab10":
        c = colormaps["tab10"]
        return [c(i % 10) for i in range(n)]
    c = colormaps[cmap]
    return [c(0.1 + 0.75 * i / max(1, n - 1)) for i in range(n)]


def _config_entries(points: list[Point], with_ar: bool = False) -> list[tuple[str, list[Point]]]:
    """(label, points) per (group, method, budget), in method/budget order; AR left out unless asked."""
    groups, many = _groups(points)
    out = []
    for g, pts in groups.items():
        by: dict[tuple, list[Point]] = defaultdict(list)
        for p in pts:
            if p.method == "ar" and not with_ar:
                continue
            by[(p.method != "ddtree", p.method, p.budget or 0)].append(p)
        for key in sorted(by, key=lambda k: (k[0] is False, k[1], k[2])):
            label = by[key][0].config_label
            out.append((f"{g}: {label}" if many else label, by[key]))
    return out


def _config_colour_map(entries: list[tuple[str, list[Point]]]) -> dict[str, Any]:
    tree = [lbl for lbl, pts in entries if pts[0].method == "ddtree"]
    seq = dict(zip(tree, _colours(len(tree), "viridis")))
    out = {}
    for lbl, pts in entries:
        m = pts[0].method
        out[lbl] = seq.get(lbl) if m == "ddtree" else ("#d62728" if m == "dflash" else "#7f7f7f")
    return out


def _configs_of(data: ReportData, points: list[Point]) -> list:
    """The distinct configurations (data.configs) the given points belong to."""
    ids = {id(p) for p in points}
    return [c for c in data.configs if any(id(q) in ids for q in c.points)]


def _pooled_histogram(points: list[Point]) -> dict[int, float] | None:
    """Round-weighted mean of the points' histograms (equal weights when round counts are missing)."""
    hs = [(p.histogram, p.num_rounds or 1) for p in points if p.histogram]
    if not hs:
        return None
    total = sum(w for _, w in hs)
    keys = sorted({k for h, _ in hs for k in h})
    return {k: sum(h.get(k, 0.0) * w for h, w in hs) / total for k in keys}


def _pooled_depth(points: list[Point]) -> list[float] | None:
    rs = [(p.rate_by_depth, p.num_rounds or 1) for p in points if p.rate_by_depth]
    if not rs:
        return None
    n = max(len(r) for r, _ in rs)
    total = sum(w for _, w in rs)
    return [sum((r[i] if i < len(r) else 0.0) * w for r, w in rs) / total for i in range(n)]


# ---------------------------------------------------------------------------- figures


def fig_tau_vs_budget(data: ReportData) -> Figure | None:
    pts = data.ok_points
    budgets = _ddtree_budgets(pts)
    if len(budgets) < 2:
        return None
    groups, _ = _groups(pts)
    fig, axes = _new(w=7.5, h=3.6)
    ax = axes[0][0]
    colours = _colours(len(groups))
    for (g, gp), col in zip(groups.items(), colours):
        xs, ys = [], []
        for b in budgets:
            t = _mean([p.values.get("tau_mean") for p in gp if p.method == "ddtree" and p.budget == b])
            if t is not None:
                xs.append(b), ys.append(t)
        if xs:
            ax.plot(xs, ys, "o-", color=col, label=f"{g}: DDTree")
        d = _mean([p.values.get("tau_mean") for p in gp if p.method == "dflash"])
        if d is not None:
            ax.axhline(d, color=col, ls="--", lw=1.2, label=f"{g}: DFlash (chain)")
    ax.axhline(1.0, color="#7f7f7f", ls=":", lw=1.2, label="AR (\u03c4 = 1)")
    _budget_axis(ax, budgets)
    ax.set_ylabel("acceptance length \u03c4 (tokens / round)")
    _ylim_from_zero(ax)
    ax.set_title("Acceptance length vs tree budget")
    ax.legend(loc="best")
    return Figure(
        "fig-tau-vs-budget", "Acceptance length \u03c4 vs tree budget", (
            "\u03c4 is the mean number of tokens each verify round commits, the bonus token included (mean over "
            "requests of each request's mean; one line per suite). Higher is better. \u03c4 rises with the budget and "
            "flattens: past the knee, a bigger tree costs verify time without committing more tokens. Dashed: DFlash "
            "(one chain of drafts) at the same settings; dotted: AR, which commits exactly one token per round."),
        _to_uri(fig), "Line chart of acceptance length against tree budget")


def fig_throughput_vs_budget(data: ReportData) -> Figure | None:
    pts = data.ok_points
    budgets = _ddtree_budgets(pts)
    if len(budgets) < 2:
        return None
    groups, many = _groups(pts)
    groups = dict(list(groups.items())[:4])
    fig, axes = _new(len(groups), 2, w=10.5, h=3.4 * len(groups))
    any_bars = False
    unhonoured: set[str] = set()  # load levels some point did not honour (labelled; no cross-load reading)
    for row, (g, gp) in enumerate(groups.items()):
        loads = sorted({(p.request_rate is not None, p.request_rate or p.concurrency or 0): p.load_label for p in gp}.items())
        colours = _colours(len(loads))
        ax_t, ax_s = axes[row]
        any_speedup = False
        for ((_, _), label), col in zip(loads, colours):
            lp = [p for p in gp if p.load_label == label]
            if any(p.load_not_honoured for p in lp):
                unhonoured.add(label)
                label += " (not honoured)"
            for ax, key in ((ax_t, "tok_s"), (ax_s, "speedup_vs_ar")):
                metric = "output_throughput_tok_s" if key == "tok_s" else key
                xs, ys, lo, hi = [], [], [], []
                for b in budgets:
                    cs = _configs_of(data, [p for p in lp if p.method == "ddtree" and p.budget == b])
                    v = _mean([c.value(metric) for c in cs])
                    if v is not None:
                        iv = cs[0].interval(metric) if len(cs) == 1 else None
                        xs.append(b), ys.append(v), lo.append(v - iv.low if iv else 0.0), hi.append(iv.high - v if iv else 0.0)
                if xs:
                    ax.plot(xs, ys, "o-", color=col, label=f"DDTree {label}")
                    if any(lo) or any(hi):
                        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="none", ecolor=col, elinewidth=1.0, capsize=3)
                        any_bars = True
                    any_speedup |= key == "speedup_vs_ar"
                for method, ls in (("dflash", "--"), ("ar", ":")):
                    if method == "ar" and key != "tok_s":
                        continue
                    cs = _configs_of(data, [p for p in lp if p.method == method])
                    d = _mean([c.value(metric) for c in cs])
                    if d is None:
                        continue
                    ax.axhline(d, color=col, ls=ls, lw=1.1, label=f"{'DFlash' if method == 'dflash' else 'AR'} {label}")
                    iv = cs[0].interval(metric) if len(cs) == 1 else None
                    if iv is not None and iv.high > iv.low:
                        ax.axhspan(iv.low, iv.high, color=col, alpha=0.12, lw=0)
                        any_bars = True
        ax_s.axhline(1.0, color="#7f7f7f", ls=":", lw=1.2, label="AR (1\u00d7)")
        if not any_speedup:
            ax_s.text(0.5, 0.5, "no AR point at the same settings", transform=ax_s.transAxes, ha="center", color="#555")
        for ax in (ax_t, ax_s):
            _budget_axis(ax, budgets)
            _ylim_from_zero(ax)
        suffix = f" \u2014 {g}" if many else ""
        ax_t.set_ylabel("output throughput (tokens / s)")
        ax_t.set_title("Output throughput" + suffix)
        ax_s.set_ylabel("speedup vs AR (\u00d7)")
        ax_s.set_title("Speedup vs AR" + suffix)
        handles: dict[str, Any] = {}
        for ax in (ax_t, ax_s):
            for h, lbl in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(lbl, h)
        ax_s.legend(handles.values(), handles.keys(), loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return Figure(
        "fig-throughput-vs-budget", "Throughput and speedup vs tree budget", (
            "Left: output tokens per second over the whole run (all requests' output tokens \u00f7 first send to last "
            "completion). Right: speedup over AR at the same settings, from per-request times paired by prompt. One "
            "colour per load level (concurrency c or request rate); dashed: DFlash, dotted: AR. Pick the budget at the "
            "peak for the load you serve, and compare the peaks across loads: when verify work competes with other "
            "requests, the best budget can move smaller." + (
                f" Load levels marked \u2018not honoured\u2019 ({', '.join(sorted(unhonoured))}): the backend did not run "
                "that many requests at once, so those lines are not that load; do not compare their peaks with the "
                "other loads'." if unhonoured else "") + (
                " Error bars (and shaded bands around the DFlash / AR lines) are 95% confidence intervals: the speedup's "
                "from a paired bootstrap over prompts (and repeats), tok/s's from the spread over repeats (none with one "
                "repeat). Peaks whose bars overlap are not distinguishable on this data." if any_bars else
                " No intervals on this data (they need records, and tok/s needs --repeats >= 2).")),
        _to_uri(fig), "Line charts of output throughput and speedup against tree budget, one line per load level")


def fig_accept_histogram(data: ReportData) -> Figure | None:
    entries = [(lbl, h, ps) for lbl, ps in _config_entries(data.ok_points) if (h := _pooled_histogram(ps))]
    if not entries:
        return None
    shown = entries[:MAX_PANELS]
    n = len(shown)
    ncols = min(4, n)
    nrows = (n + ncols - 1) // ncols
    fig, axes = _new(nrows, ncols, w=2.4 * ncols + 0.6, h=2.2 * nrows + 0.5, sharex=True, sharey=True)
    colours = _config_colour_map([(lbl, ps) for lbl, _, ps in shown])
    top = max(16, max(max(h) for _, h, _ in shown))
    for i, (lbl, h, ps) in enumerate(shown):
        ax = axes[i // ncols][i % ncols]
        ks = list(range(1, top + 1))
        ax.bar(ks, [h.get(k, 0.0) for k in ks], color=colours[lbl], width=0.8)
        tau = _mean([p.values.get("tau_mean") for p in ps])
        ax.set_title(lbl + (f"  (\u03c4 = {tau:.2f})" if tau is not None else ""), fontsize=9)
        ax.set_xticks([1, 4, 8, 12, 16] if top <= 16 else [1, top // 4, top // 2, 3 * top // 4, top])
        ax.xaxis.set_tick_params(labelbottom=True)  # every panel keeps its numbers (sharex hides all but the last row's)
    for j in range(n, nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    for r in range(nrows):
        axes[r][0].set_ylabel("fraction of rounds")
    for c in range(ncols):  # the lowest visible panel of each column carries the x axis
        bottom = axes[(n - 1 - c) // ncols][c]  # ncols <= n, so every column has a panel
        bottom.xaxis.set_tick_params(labelbottom=True)
        bottom.set_xlabel("a\u1d63 (tokens / round)")
    more = f" Showing the first {MAX_PANELS} of {len(entries)} configurations." if len(entries) > MAX_PANELS else ""
    return Figure(
        "fig-accept-histogram", "Acceptance-length histogram per method and budget", (
            "Each panel: the fraction of verify rounds that committed a\u1d63 = k tokens (bonus included), pooled over "
            "all rounds of all requests of that configuration. Mass at 1 means the draft was rejected at its first "
            "token; mass far right means long accepted paths. AR is left out (every round commits 1)." + more),
        _to_uri(fig), "Bar charts of the acceptance-length distribution per configuration")


def fig_accept_by_depth(data: ReportData) -> Figure | None:
    entries = [(lbl, r, ps) for lbl, ps in _config_entries(data.ok_points) if (r := _pooled_depth(ps))]
    if not entries:
        return None
    fig, axes = _new(w=7.5, h=3.6)
    ax = axes[0][0]
    colours = _config_colour_map([(lbl, ps) for lbl, _, ps in entries])
    for lbl, r, ps in entries[:MAX_DEPTH_CURVES]:
        ax.plot(range(1, len(r) + 1), r, marker="o" if len(r) <= 16 else None, ms=3, color=colours[lbl],
                ls="--" if ps[0].method == "dflash" else "-", label=lbl)
    ax.set_xlabel("depth d (drafted tokens past the root)")
    ax.set_ylabel("fraction of rounds with a\u1d63 \u2212 1 \u2265 d")
    ax.set_ylim(0, 1.02)
    ax.set_xlim(left=0.5)
    ax.set_title("Acceptance rate by depth")
    ax.legend(loc="upper right", ncols=2 if len(entries) > 6 else 1)
    return Figure(
        "fig-accept-by-depth", "Acceptance rate by depth", (
            "For each depth d, the fraction of verify rounds that accepted at least d drafted tokens beyond the root "
            "(for a chain this is vLLM's per-position acceptance rate). The curve starts at the first-token acceptance "
            "rate and falls with depth; a larger budget lifts the whole curve because the tree carries more "
            "alternatives at every depth. Dashed: DFlash." + _shown(MAX_DEPTH_CURVES, len(entries))),
        _to_uri(fig), "Line chart of the fraction of rounds reaching each accepted depth")


def fig_tree_use(data: ReportData) -> Figure | None:
    pts = data.ok_points
    budgets = _ddtree_budgets(pts)
    if len(budgets) < 2:
        return None
    groups, _ = _groups(pts)
    fig, axes = _new(1, 2, w=9.5, h=3.5)
    ax_d, ax_u = axes[0]
    colours = _colours(len(groups))
    max_depth = max((len(p.histogram) - 1 for p in pts if p.histogram), default=None)
    for (g, gp), col in zip(groups.items(), colours):
        xs, depth, use = [], [], []
        for b in budgets:
            t = _mean([p.values.get("tau_mean") for p in gp if p.method == "ddtree" and p.budget == b])
            if t is not None:
                xs.append(b), depth.append(t - 1.0), use.append(100.0 * (t - 1.0) / b)
        if xs:
            ax_d.plot(xs, depth, "o-", color=col, label=f"{g}: DDTree")
            pos = [(x, u) for x, u in zip(xs, use) if u > 0]  # a log axis cannot show 0 (nothing accepted)
            ax_u.plot([x for x, _ in pos], [u for _, u in pos], "o-", color=col, label=f"{g}: DDTree")
        d = _mean([p.values.get("tau_mean") for p in gp if p.method == "dflash"])
        if d is not None:
            ax_d.axhline(d - 1.0, color=col, ls="--", lw=1.1, label=f"{g}: DFlash")
    if max_depth:
        ax_d.axhline(max_depth, color="#7f7f7f", ls=":", lw=1.2, label=f"deepest possible ({max_depth})")
    for ax in (ax_d, ax_u):
        _budget_axis(ax, budgets)
    ax_d.set_ylim(bottom=0)
    ax_d.set_ylabel("mean accepted depth \u03c4 \u2212 1 (tokens)")
    ax_d.set_title("Accepted path depth")
    ax_u.set_yscale("log")
    _percent_log_ticks(ax_u)
    ax_u.set_ylabel("accepted nodes / budget (%, log scale)")
    ax_u.set_title("Share of the tree used")
    ax_d.legend(loc="best")
    ax_u.legend(loc="best")
    return Figure(
        "fig-tree-use", "Accepted depth vs budget (how much of the tree is used)", (
            "Left: mean accepted path depth per round (\u03c4 \u2212 1 drafted tokens, bonus excluded) against the "
            "deepest path the drafter can propose. Right: the same depth as a share of the B tree nodes the target "
            "verified each round (log scale; a budget where nothing was accepted has no point). The share falls as B "
            "doubles; where the depth stops rising while the share keeps halving, extra budget is verify work that "
            "buys nothing."),
        _to_uri(fig), "Line charts of accepted depth and tree utilisation against tree budget")


def _fig_latency(data: ReportData, closed_loop: bool) -> Figure | None:
    pts = [p for p in data.ok_points if (p.request_rate is None) == closed_loop]
    xval: Callable[[Point], float | None] = (lambda p: p.concurrency) if closed_loop else (lambda p: p.request_rate)
    xs_all = sorted({x for p in pts if (x := xval(p)) is not None})
    if len(xs_all) < 2:
        return None
    every = _config_entries(pts, with_ar=True)
    entries = every[:MAX_LATENCY_CURVES]
    colours = _config_colour_map(entries)
    # points whose concurrency was not honoured are no measurement at their load: marked, never on a curve
    unhonoured = sorted({p.load_label for p in pts if p.load_not_honoured})
    fig, axes = _new(1, 2, w=10.5, h=3.6)
    for ax, metric, unit in ((axes[0][0], "ttft", "TTFT (ms)"), (axes[0][1], "tpot", "TPOT (ms / token)")):
        for lbl, ps in entries:
            for q, ls, mk in (("p50", "-", "o"), ("p99", "--", "^")):
                xs, ys, xs_bad, ys_bad = [], [], [], []
                for x in xs_all:
                    good = [p for p in ps if xval(p) == x and not p.load_not_honoured]
                    v = _mean([p.values.get(f"{metric}_ms_{q}") for p in good])
                    if v is not None:
                        xs.append(x), ys.append(v)
                    bad = _mean([p.values.get(f"{metric}_ms_{q}") for p in ps if xval(p) == x and p.load_not_honoured])
                    if bad is not None:
                        xs_bad.append(x), ys_bad.append(bad)
                if xs:
                    ax.plot(xs, ys, ls=ls, marker=mk, ms=3.5, color=colours[lbl])
                if xs_bad:
                    ax.plot(xs_bad, ys_bad, ls="none", marker="x", ms=6, color=colours[lbl])
        _load_axis(ax, xs_all, "concurrency (requests in flight)" if closed_loop else "request rate (requests / s)")
        ax.set_ylabel(unit)
        _ylim_from_zero(ax)
        ax.set_title(f"{metric.upper()} p50 (solid) and p99 (dashed)")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colours[lbl], lw=2, label=lbl) for lbl, _ in entries]
    handles += [Line2D([], [], color="#333", ls="-", marker="o", ms=3.5, label="p50"),
                Line2D([], [], color="#333", ls="--", marker="^", ms=3.5, label="p99")]
    if unhonoured:
        handles.append(Line2D([], [], color="#333", ls="none", marker="x", ms=6, label="load not honoured"))
    fig.legend(handles=handles, loc="outside right upper", fontsize=8)
    which = "concurrency" if closed_loop else "request rate"
    caption = (f"Time to first token (left) and time per output token after the first (right), median and 99th "
               f"percentile, against {which}. ")
    if unhonoured:
        caption += (f"\u00d7: points at {', '.join(unhonoured)} whose backend did not honour the concurrency (it ran "
                    "the requests one at a time, or fewer at once, so they queued): their latencies are not those of "
                    "that load, so they are on no curve, and no trend across load should be read from them. ")
    caption += ("Speculative decoding should lower TPOT at low load; where the curves are drawn, watch where its TPOT "
                "curve crosses AR's as load grows \u2014 past that point the tree's extra verify work costs more than "
                "it saves. TTFT includes queueing, so it grows with load for every method."
                + _shown(MAX_LATENCY_CURVES, len(every)))
    return Figure(
        f"fig-latency-vs-{'concurrency' if closed_loop else 'rate'}", f"TTFT and TPOT percentiles vs {which}", caption,
        _to_uri(fig), f"Line charts of TTFT and TPOT percentiles against {which}")


def fig_latency_vs_concurrency(data: ReportData) -> Figure | None:
    return _fig_latency(data, closed_loop=True)


def fig_latency_vs_rate(data: ReportData) -> Figure | None:
    return _fig_latency(data, closed_loop=False)


def fig_stage_split(data: ReportData) -> Figure | None:
    pts = [p for p in data.ok_points if p.stage_ms and (p.summary or {}).get("total_output_tokens")]
    if not pts:
        return None
    trimmed = len(pts) > MAX_BARS
    if trimmed:  # keep the lowest load level so the bars stay readable
        lowest = min(pts, key=lambda p: (p.request_rate is not None, p.request_rate or p.concurrency or 0)).load_label
        pts = [p for p in pts if p.load_label == lowest][:MAX_BARS]
    groups, many = _groups(pts)
    group_of = {id(q): g for g, qs in groups.items() for q in qs}   # model / backend / suite / T, where several
    several_loads = len({p.load_label for p in pts}) > 1
    several_repeats = len({p.repeat for p in pts}) > 1
    labels, rows = [], []
    for p in pts:
        lbl = (p.config_label + (f" {p.load_label}" if several_loads else "") + (f" [{group_of[id(p)]}]" if many else "")
               + (f" #{p.repeat}" if several_repeats else ""))
        labels.append(lbl)
        n = float(p.summary["total_output_tokens"])
        rows.append({k: v / n for k, v in p.stage_ms.items()})
    stages = [s for s in STAGE_ORDER if any(s in r for r in rows)] + sorted({k for r in rows for k in r} - set(STAGE_ORDER))
    fig, axes = _new(w=8.5, h=1.6 + 0.3 * len(pts))
    ax = axes[0][0]
    y = list(range(len(pts)))[::-1]
    left = [0.0] * len(pts)
    extra = _colours(len(stages), "tab10")
    for i, s in enumerate(stages):
        vals = [r.get(s, 0.0) for r in rows]
        ax.barh(y, vals, left=left, color=STAGE_COLOURS.get(s, extra[i]), label=s, height=0.7)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_yticks(y)
    ax.set_yticklabels(labels)
    ax.set_ylim(-0.6, len(pts) - 0.4)
    ax.grid(axis="y", visible=False)
    ax.set_xlabel("engine time per output token (ms), by stage")
    ax.set_title("Where each token's time goes")
    fig.legend(loc="outside upper center", ncols=len(stages), frameon=False)
    note = f" Only {pts[0].load_label} is shown (too many points for one chart)." if trimmed else ""
    return Figure(
        "fig-stage-split", "Per-stage time split", (
            "Engine stage totals (summed over requests) divided by output tokens: draft = drafter forward, "
            "tree_build = turning draft logits into the budgeted tree, verify = the target's forward over the tree, "
            "commit = accepting the path and compacting the KV cache, prefill = the prompt. Verify grows with the "
            "budget; draft and tree_build are per-round costs that a longer accepted path spreads over more tokens. "
            "Shown only where the engine reports stage times (the in-process engine does)." + note),
        _to_uri(fig), "Stacked bar chart of engine time per output token split by stage")


FIGURES: tuple[Callable[[ReportData], Figure | None], ...] = (
    fig_tau_vs_budget,
    fig_throughput_vs_budget,
    fig_tree_use,
    fig_accept_histogram,
    fig_accept_by_depth,
    fig_latency_vs_concurrency,
    fig_latency_vs_rate,
    fig_stage_split,
)


def make_figures(data: ReportData) -> list[Figure]:
    """Every figure whose data exists, in page order."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    out = []
    with matplotlib.rc_context(RC):
        for f in FIGURES:
            fig = f(data)
            if fig is not None:
                out.append(fig)
    return out
