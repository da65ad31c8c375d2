"""Rendering the report page: `ReportData` + figures -> one self-contained HTML string.

Escaping is by construction (report/markup.py): every fragment is an `Html` (already safe) or gets
escaped by `esc` when it is put into an element or attribute, so a prompt, model output, file name,
flag or error string containing `<script>` shows as text. Element ids come from `Ids.make`, which
keeps only [A-Za-z0-9_-] and makes them unique. The page has no scripts, no external resources
(the CSS is inlined, figures are `data:` URIs) and a Content-Security-Policy that would block any
that slipped in; it reads the same without JavaScript and prints without clipping.

This module knows nothing of loading files or drawing plots.
"""

from __future__ import annotations

import json
import re
import shlex
from collections import defaultdict
from datetime import datetime, timezone
from importlib import resources
from typing import Any

from ddtree_bench import __version__, metrics
from ddtree_bench.report.explain_section import section_explain
from ddtree_bench.report.sampling_section import section_sampling
from ddtree_bench.report.markup import Html, Ids, el, esc, fmt, join
from ddtree_bench import defaults as D
from ddtree_bench.noise.probe import HEAVY_RULE
from ddtree_bench.noise.verdict import FORMULA, Candidate, Verdict, decide, sentence
from ddtree_bench.pair import BUILTIN
from ddtree_bench.report.data import CompareResult, Config, Point, ReportData, Source
from ddtree_bench.report.plots import Figure

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
MAX_REQUEST_ROWS = 200
MAX_TEXT = 4000          # characters of one output text shown in full
MAX_CELL = 300           # characters of an error in a table cell
MAX_META_VALUES = 16     # distinct values listed in one metadata row


def _clip(s: Any, n: int) -> str:
    s = "" if s is None else str(s)
    return s if len(s) <= n else s[: n - 1] + "\u2026"


def _css() -> str:
    return resources.files("ddtree_bench.report").joinpath("report.css").read_text(encoding="utf-8")


# ---------------------------------------------------------------------------- sections


def _distinct(points: list[Point], get) -> list[str]:
    seen: list[str] = []
    for p in points:
        v = get(p)
        if v is None or v == "":
            continue
        s = str(v)
        if s not in seen:
            seen.append(s)
    return seen


def _meta_value(values: list[str], code: bool = False) -> Html:
    if not values:
        return Html("\u2014")
    wrap = (lambda v: el("code", v)) if code else esc
    if len(values) == 1:
        return wrap(values[0])
    shown = values[:MAX_META_VALUES]
    more = f" \u2026 and {len(values) - MAX_META_VALUES} more" if len(values) > MAX_META_VALUES else ""
    return Html(el("span", "varies: ", class_="varies") + join([wrap(v) for v in shown], "; ") + esc(more))


def _versions(p: Point) -> str | None:
    v = p.run.get("versions")
    return " \u00b7 ".join(f"{k} {x}" for k, x in v.items() if x is not None) if isinstance(v, dict) and v else None


def _backend(p: Point) -> str | None:
    b = p.run.get("backend") if isinstance(p.run.get("backend"), dict) else {}
    kind = b.get("kind") or p.spec.get("backend")
    if kind is None:
        return None
    ver = b.get("server_version") or b.get("version") or (p.csv_row or {}).get("server_version")
    vers = p.run.get("versions") if isinstance(p.run.get("versions"), dict) else {}
    ver = ver or vers.get(str(kind))
    url = p.spec.get("url")
    return f"{kind}" + (f" {ver}" if ver else "") + (f" at {url}" if url else "")


def _device(p: Point) -> str | None:
    d = p.run.get("device") if isinstance(p.run.get("device"), dict) else {}
    what = p.spec.get("device")
    hw = d.get("gpu") or d.get("processor")
    extra = [x for x in (hw, f"CUDA {d['cuda']}" if d.get("cuda") else None, d.get("platform")) if x]
    return " \u00b7 ".join(str(x) for x in ([what] if what else []) + extra) or None


def _suite(p: Point) -> str | None:
    s = p.run.get("suite") if isinstance(p.run.get("suite"), dict) else {}
    if not s and not p.spec.get("suite"):
        return None
    parts = [str(s.get("name") or p.suite)]
    if s.get("source"):
        parts.append(f"source {s['source']}")
    parts.append(f"subset rule {s.get('subset_rule') or 'none (all, in file order)'}")
    if s.get("template"):
        parts.append(f"template {_clip(' '.join(str(s['template']).split()), 90)}")
    if s.get("num_prompts") is not None:
        parts.append(f"{s['num_prompts']} prompts")
    return " \u00b7 ".join(parts)


def _draft(p: Point) -> str | None:
    if p.method == "ar":
        return None
    b = p.run.get("backend") if isinstance(p.run.get("backend"), dict) else {}
    d = p.spec.get("draft") or b.get("draft_path") or b.get("draft")
    h = b.get("draft_hash")
    if d is None and p.spec.get("model") in BUILTIN:
        d = f"bundled with --model {p.spec.get('model')}"
    return None if d is None else f"{d}" + (f" (hash {h})" if h else "")


def _model(p: Point) -> str | None:
    b = p.run.get("backend") if isinstance(p.run.get("backend"), dict) else {}
    m = p.spec.get("model")
    h = b.get("model_hash")
    return None if m is None else f"{m}" + (f" (hash {h})" if h else "")


def _command(p: Point) -> str | None:
    c = p.run.get("command")
    if isinstance(c, list):
        return shlex.join(str(x) for x in c)
    return None if c is None else str(c)


def _date_range(points: list[Point]) -> list[str]:
    """[first start -> last finish] over the points (ISO strings sort by time)."""
    starts = sorted(str(p.run["started_at"]) for p in points if p.run.get("started_at"))
    ends = sorted(str(p.run["finished_at"]) for p in points if p.run.get("finished_at"))
    if not starts:
        return []
    return [starts[0] + (f" \u2192 {ends[-1]}" if ends else "")]


def _fault(p: Point) -> str | None:
    """'target variant gdn-crop (not lossless by design)' for a fault-injected run or server, else None."""
    return f"target variant {p.fault_injection} (not lossless by design)" if p.fault_injection else None


def section_metadata(data: ReportData) -> Html:
    pts = [p for p in data.points if p.run] or data.points
    sweep_rows = []
    for s in data.sources:
        if s.kind == "sweep" and s.sweep:
            extra = {k: s.sweep.get(k) for k in ("command", "git_sha", "started_at", "finished_at") if s.sweep.get(k)}
            cmd = extra.get("command")
            desc = f"{s.path} \u2014 {len(s.points)} points"
            sweep_rows.append(el("tr", el("th", "Sweep"), el("td", esc(desc), *(
                [el("br"), el("code", shlex.join(map(str, cmd)) if isinstance(cmd, list) else cmd)] if cmd else []))))
    fields = [
        ("Model (target)", _model, False),
        ("Draft", _draft, False),
        ("Backend and version", _backend, False),
        ("Methods", lambda p: p.config_label, False),
        ("Device", _device, False),
        ("Dtype", lambda p: p.spec.get("dtype"), False),
        ("Suite and subset rule", _suite, False),
        ("Load", lambda p: p.load_label, False),
        ("Max new tokens \u00b7 temperature \u00b7 seed",
         lambda p: f"{p.spec.get('max_new_tokens')} \u00b7 T={p.temperature:g} \u00b7 seed {p.spec.get('seed')}" if p.run else None, False),
        ("Date (UTC)", None, False),
        ("Versions", _versions, False),
        ("Git sha (ddtree-bench)", lambda p: p.run.get("git_sha"), True),
        ("Command", _command, True),
    ]
    if any(_fault(p) for p in pts):   # a run made under --target-variant: deliberately not lossless
        fields.insert(1, ("FAULT INJECTION", lambda p: _fault(p) or "none (the reference target)", False))
    rows = list(sweep_rows)
    for name, get, code in fields:
        values = _date_range(pts) if get is None else _distinct(pts, get)
        rows.append(el("tr", el("th", name), el("td", _meta_value(values, code=code))))
    return el("section", el("h2", "Run metadata"), el("div", el("table", *rows, class_="meta"), class_="table-wrap"), id="metadata")


def disqualified(c: Config) -> str | None:
    """Why a configuration is not ranked (a point of it failed correctness or is a fault injection), else None."""
    return next((why for p in c.points if (why := p.failed_correctness)), None)


def verdicts(data: ReportData) -> list[tuple[tuple, Verdict]]:
    """One verdict per (model, suite, temperature, load): by speedup vs AR when every configuration has one,
    else by tok/s; a winner only when its interval clears the runner-up's (noise/verdict.py). A load
    level some point did not honour (summary.json `concurrency_honoured` false) gets none."""
    groups: dict[tuple, list[Config]] = defaultdict(list)
    for c in data.configs:
        if not disqualified(c):   # a point that failed correctness is never the fastest (listed in the takeaways)
            groups[c.group_key()].append(c)
    out = []
    for key, cs in groups.items():
        if any(q.load_not_honoured for c in cs for q in c.points):
            continue  # a load the backend did not honour (it ran requests one at a time): `unhonoured_groups`
        metric = "speedup_vs_ar" if all(c.speedup_value is not None for c in cs) else "output_throughput_tok_s"
        cands = [Candidate(c.label, c.value(metric), c.interval(metric), c) for c in cs]
        out.append((key, decide(cands, metric, max(c.repeats for c in cs))))
    return sorted(out, key=lambda kv: kv[1].ranked[0].ref.first.sort_key() if kv[1].ranked else ())


def unhonoured_groups(data: ReportData) -> list[tuple[tuple, Point]]:
    """(model, suite, temperature, load) and its first point whose concurrency was not honoured, per load level
    that therefore gets no takeaway (said in the Takeaways section, never skipped silently)."""
    out: dict[tuple, Point] = {}
    for c in data.configs:
        for q in c.points:
            if q.load_not_honoured:
                out.setdefault(c.group_key(), q)
    return sorted(out.items(), key=lambda kv: kv[1].sort_key())


def _not_honoured_text(p: Point) -> str:
    return "concurrency not honoured" + (f": {p.concurrency_why}" if p.concurrency_why else "")


def _winner_points(data: ReportData) -> set[int]:
    return {id(v.winner.ref.first) for _, v in verdicts(data) if v.winner is not None and len(v.ranked) > 1}


def _iv_text(c: Config, metric: str, digits: int, suffix: str = "") -> str:
    v, iv = c.value(metric), c.interval(metric)
    if v is None:
        return "\u2014"
    return f"{v:,.{digits}f}{suffix}" + (f" [{iv.low:,.{digits}f}, {iv.high:,.{digits}f}]" if iv else "")


def _heavy_text(p: Point) -> str | None:
    if not p.heavy_load:
        return None
    share = p.other_cpu_share
    return "heavy machine load" + (f" (other processes used {100 * share:.0f}% of the CPU cores)" if share is not None else "")


def _gpu_text(p: Point) -> str | None:
    if not p.gpu_capped:
        return None
    mhz = p.gpu_sm_clock_mhz
    return (f"GPU at its power cap on {100 * p.gpu_power_capped_share:.0f}% of samples"
            + (f" (median SM clock {mhz:,.0f} MHz)" if mhz is not None else ""))


def section_takeaways(data: ReportData, anchors: dict[int, str]) -> Html:
    """Per load level: the fastest configuration when the intervals say so, else which are indistinguishable
    and how many repeats would separate them; then every configuration's intervals and the noise flags."""
    vs = verdicts(data)
    skipped = unhonoured_groups(data)
    if len(data.ok_points) < 2 or not (vs or skipped or any(disqualified(c) for c in data.configs)):
        return Html("")
    pct = f"{100 * D.CI_LEVEL:g}%"
    items = []
    models = len({c.first.model for c in data.configs}) > 1   # heads and rows of two models say which

    def group_head(p: Point) -> str:
        return ", ".join([*([p.model_name] if models else []), p.suite, p.load_label,
                          *([f"T={p.temperature:g}"] if p.temperature else [])]) + ": "

    for _, v in vs:
        head = group_head(v.ranked[0].ref.first)
        link = []
        if v.winner is not None:
            link = [" (", el("a", "row", href=f"#{anchors[id(v.winner.ref.first)]}"), ")"]
        items.append(el("li", head, sentence(v), *link))
    for c in data.configs:
        if (why := disqualified(c)):
            items.append(el("li", group_head(c.first), el("strong", "not ranked"), f" — {c.label}: {why}; its speed "
                            "is not a candidate for fastest (", el("a", "row", href=f"#{anchors[id(c.first)]}"), ").",
                            class_="warn"))
    for _, p in skipped:
        head = group_head(p)
        items.append(el("li", head, el("strong", "no takeaway"), f" \u2014 {p.config_label} at this load: {_not_honoured_text(p)}. "
                        "Its figures are not measurements at that load, so they are not ranked or compared across loads (",
                        el("a", "row", href=f"#{anchors[id(p)]}"), ").", class_="warn"))
    rows = []
    temps = len({c.first.temperature for c in data.configs}) > 1  # rows of two temperatures say which
    suites = len({c.first.suite for c in data.configs}) > 1
    for _, v in vs:
        for c in v.ranked:
            cfg: Config = c.ref
            heavy = cfg.heavy_points
            where = ", ".join([*([cfg.first.model_name] if models else []), *([cfg.first.suite] if suites else []), cfg.first.load_label,
                               *([f"T={cfg.first.temperature:g}"] if temps else [])])
            rows.append(el("tr", el("td", el("a", cfg.label, href=f"#{anchors[id(cfg.first)]}")),
                           el("td", where), el("td", cfg.repeats, class_="num"),
                           el("td", _iv_text(cfg, "speedup_vs_ar", 2, "\u00d7"), class_="num"),
                           el("td", _iv_text(cfg, "output_throughput_tok_s", 1), class_="num"),
                           el("td", f"{len(heavy)} of {cfg.repeats}" if heavy else "", class_="num"),
                           class_="best" if v.winner is c and len(v.ranked) > 1 else None))
    head = el("tr", *[el("th", h) for h in ("configuration", "settings" if (temps or suites or models) else "load", "repeats", f"speedup vs AR [{pct} CI]",
                                            f"tok/s [{pct} CI]", "heavy-load repeats")])
    table = el("div", el("table", el("thead", head), el("tbody", *rows), class_="grid"), class_="table-wrap")
    method = el("p", (
        f"Intervals are {pct} confidence intervals. Speedup vs AR: paired per prompt with the AR point of the same "
        f"repeat, percentile bootstrap over prompts ({D.CI_RESAMPLES} resamples, seed {D.CI_SEED}), two-way over "
        "repeats and prompts when there are several. Output tok/s: one figure per repeat, so its interval needs "
        "--repeats \u2265 2 (Student t over repeats, lower bound clipped at 0). A configuration is named fastest only "
        "when its interval lies wholly above the runner-up's; otherwise the repeats that would separate them are "
        f"estimated as {FORMULA} (h: the half-widths facing each other, \u0394: the gap of the estimates, assuming "
        "the half-widths shrink as 1/\u221an; for the speedup a lower bound, since prompt-to-prompt spread does not "
        "shrink with repeats)."), class_="muted")
    heavy_pts = [p for p in data.ok_points if p.heavy_load]
    noise = []
    if heavy_pts:
        noise.append(el("p", el("strong", f"{len(heavy_pts)} of {len(data.ok_points)} measured points ran under heavy load"),
                        f" ({HEAVY_RULE}); they are marked in the headline table. Their times include waiting for "
                        "the CPU, so compare them with care.", class_="warn"))
    recorded = [p for p in data.ok_points if p.noise]
    if recorded and not heavy_pts:
        failed_heavy = sum(1 for p in data.points if not p.ok and p.heavy_load)
        noise.append(el("p", f"Machine load was recorded for {len(recorded)} measured points; none ran under heavy load "
                             f"({HEAVY_RULE})" + (f"; {failed_heavy} failed point{'s' if failed_heavy > 1 else ''} did, as "
                                                  "its note in the headline table says" if failed_heavy else "") + ".",
                        class_="muted"))
    note = el("p", "Measured on these inputs only; check the curves below for how sharp the optimum is.", class_="muted")
    return el("section", el("h2", "Takeaways"), el("ul", *items), *noise, table, method, note, id="takeaways")


# (header, tooltip, cell, css class, kept even when every row has the same value)
_HEADLINE_COLUMNS: tuple[tuple[str, str | None, Any, str | None, bool], ...] = (
    ("point", "run directory / grid point", lambda p, v: el("code", p.id), "id", True),
    ("model", "the target model (its directory's name)", lambda p, v: p.model_name, None, False),
    ("suite", None, lambda p, v: p.suite, None, False),
    ("backend", "where the point ran: inprocess, standalone, vllm, sglang, ...", lambda p, v: p.spec.get("backend"), None, False),
    ("method", None, lambda p, v: p.method, None, True),
    ("B", "DDTree tree budget (nodes)", lambda p, v: fmt(p.budget), "num", True),
    ("load", "concurrency c or request rate", lambda p, v: p.load_label, None, False),
    ("T", "temperature", lambda p, v: f"{p.temperature:g}", "num", False),
    ("status", None, lambda p, v: p.status, None, False),
    ("\u03c4", "acceptance length: mean over requests of each request's mean, bonus included",
     lambda p, v: fmt(v.get("tau_mean")), "num", True),
    ("\u03c4 tok-wtd", "acceptance length pooled over all rounds", lambda p, v: fmt(v.get("tau_token_weighted")), "num", True),
    ("tok/s", "output throughput", lambda p, v: fmt(v.get("tok_s"), 1), "num", True),
    ("speedup", "vs AR at the same settings, paired per prompt; [95% interval: bootstrap over prompts]",
     lambda p, v: _point_speedup(p, v), "num", True),
    ("tok/s \u00d7 AR", "throughput ratio: output tok/s / the AR point's at the same settings and load (the batched speedup)",
     lambda p, v: fmt(v.get("throughput_ratio_vs_ar"), 2, "\u00d7"), "num", False),
    ("batch fill", "requests per engine round, mean / max (how full the batches were)",
     lambda p, v: f"{fmt(v.get('batch_size_mean'), 1)} / {fmt(v.get('batch_size_max'), 0)}" if v.get("batch_size_mean") is not None
     else "\u2014", "num", False),
    ("load honoured", "did the backend run the requests at this concurrency? yes / NO (why in the note) / ? (it does not say)",
     lambda p, v: ({True: "yes", False: "NO", None: "?"}[p.concurrency_honoured] if p.loaded else ""), None, False),
    ("TTFT p50 / p99 ms", None, lambda p, v: f"{fmt(v.get('ttft_ms_p50'), 1)} / {fmt(v.get('ttft_ms_p99'), 1)}", "num", True),
    ("TPOT p50 / p99 ms", None, lambda p, v: f"{fmt(v.get('tpot_ms_p50'), 2)} / {fmt(v.get('tpot_ms_p99'), 2)}", "num", True),
    ("requests (errors)", None, lambda p, v: f"{int(v['num_requests'])} ({int(v.get('num_errors') or 0)})"
     if v.get("num_requests") is not None else "\u2014", "num", True),
    ("note", None, lambda p, v: _clip(_note(p), MAX_CELL), "err", False),
)
_LOAD_COLUMNS = ("tok/s \u00d7 AR", "batch fill", "load honoured")  # kept whenever some point ran under load


def _note(p: Point) -> str:
    return "; ".join(x for x in (p.error, _not_honoured_text(p) if p.load_not_honoured else None, _heavy_text(p),
                                 _gpu_text(p)) if x)


def _point_speedup(p: Point, v: dict[str, Any]) -> str:
    sp = v.get("speedup_vs_ar")
    row = p.csv_row or {}
    lo, hi = row.get("speedup_vs_ar_ci_low"), row.get("speedup_vs_ar_ci_high")
    if sp is None:
        return "\u2014"
    return fmt(sp, 2, "\u00d7") + (f" [{lo:.2f}, {hi:.2f}]" if isinstance(lo, float) and isinstance(hi, float) else "")


def section_headline(data: ReportData, anchors: dict[int, str]) -> Html:
    """One row per point; columns whose value is the same on every row (e.g. one suite) are left to the metadata."""
    best = _winner_points(data)
    cells = [[(col, col[2](p, p.values)) for col in _HEADLINE_COLUMNS] for p in data.points]
    loaded = any(p.loaded for p in data.points)
    keep = [i for i, col in enumerate(_HEADLINE_COLUMNS)
            if col[4] or len({str(r[i][1]) for r in cells}) > 1
            or (col[0] in _LOAD_COLUMNS and loaded)
            or (col[0] == "note" and any(p.error or p.heavy_load or p.load_not_honoured or p.gpu_capped
                                         for p in data.points))]
    head = el("tr", *[el("th", _HEADLINE_COLUMNS[i][0], title=_HEADLINE_COLUMNS[i][1]) for i in keep])
    rows = []
    for p, row in zip(data.points, cells):
        cls = " ".join(c for c in ("failed" if not p.ok else None, "best" if id(p) in best else None) if c) or None
        tds = []
        for i in keep:
            col, value = row[i]
            tds.append(el("td", value, class_=col[3], title=_note(p) or None if col[0] == "note" else None))
        rows.append(el("tr", *tds, id=anchors[id(p)], class_=cls))
    legend = el("p", "One row per run or grid point. \u03c4 counts the bonus token; the speedup is against the AR point "
                     "at the same settings (blank when there is none), with its interval over prompts where known. Bold "
                     "rows: the fastest configuration per load level, only where its interval clears the runner-up's "
                     "(see Takeaways). Failed points are listed with their error and left out of the plots. Settings shared by "
                     "every row are in the metadata above." + (
                         " Under load (c > 1 or a request rate): tok/s \u00d7 AR is the throughput ratio to AR at the same "
                         "load (the batched speedup, beside the latency-based speedup), batch fill the requests per engine "
                         "round (mean / max), and load honoured whether the backend really ran that many requests at once "
                         "(NO: it ran them one at a time, or fewer at once; such a row is not a measurement at its load)."
                         if loaded else ""), class_="muted")
    return el("section", el("h2", "Headline numbers"), legend,
              el("div", el("table", el("thead", head), el("tbody", *rows), class_="grid"), class_="table-wrap"), id="headline")


def section_plots(figures: list[Figure], data: ReportData) -> Html:
    if not figures:
        return el("section", el("h2", "Plots"), el("p", "No plottable data (no successful runs).", class_="muted"), id="plots")
    items = [el("figure",
                Html(f'<img src="{esc(f.data_uri)}" alt="{esc(f.alt)}">'),
                el("figcaption", el("strong", f.title + ". "), f.caption),
                id=f.id) for f in figures]
    hint = "" if len(data.points) > 1 else ("A single run: the curves against budget and load appear when the report "
                                            "covers several runs or a sweep.")
    return el("section", el("h2", "Plots"), el("p", hint, class_="muted") if hint else "", *items, id="plots")


# ---------------------------------------------------------------------------- correctness

_BASE_KEYS = ("baseline", "baseline_text", "baseline_ids", "baseline_tokens", "expected")
_OUT_KEYS = ("run", "output", "output_text", "output_ids", "output_tokens", "actual", "got")
_PREFIX_KEYS = ("before", "prefix", "common", "prefix_text", "prefix_ids", "prefix_tokens")
_TOP_STATS = ("prompts", "exact_match_rate", "num_prompts", "num_confident_divergences", "num_near_ties")


def _common_len(a: Any, b: Any) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _show_piece(t: Any) -> str:
    return str(t).replace("\n", "\u23ce")


def _side(value: Any, common: int, tag: str) -> Html:
    """One side of a token diff: the shared part plain, the rest in <del>/<ins>."""
    if isinstance(value, list):
        toks = [el("span", _show_piece(t), class_="tok") for t in value]
        return Html(join(toks[:common]) + (el(tag, *toks[common:]) if toks[common:] else ""))
    s = "" if value is None else str(value)
    return Html(esc(s[:common]) + (el(tag, s[common:]) if s[common:] else ""))


def render_context(ctx: Any) -> Html:
    """A divergence's context as a token diff when it is an object with a baseline side and a run side
    (compare's `context_ids`: before / baseline / run), else as text (compare's `context` string)."""
    if ctx is None:
        return Html("")
    if isinstance(ctx, str):
        return el("pre", ctx, class_="ctx")
    if isinstance(ctx, dict):
        bk = next((k for k in _BASE_KEYS if k in ctx), None)
        ok = next((k for k in _OUT_KEYS if k in ctx), None)
        if bk and ok:
            pk = next((k for k in _PREFIX_KEYS if k in ctx), None)
            base, out = ctx[bk], ctx[ok]
            common = _common_len(base, out) if isinstance(base, (list, str)) and type(base) is type(out) else 0
            prefix = _side(ctx[pk], len(ctx[pk]) if ctx[pk] is not None else 0, "span") if pk else Html("")
            rest = {k: v for k, v in ctx.items() if k not in (bk, ok, pk)}
            extra = el("div", join([f"{k} {v}" for k, v in rest.items()], " \u00b7 "), class_="muted small") if rest else ""
            return el("div",
                      el("div", el("span", "baseline", class_="lbl"), el("code", prefix, _side(base, common, "del"))),
                      el("div", el("span", "run", class_="lbl"), el("code", prefix, _side(out, common, "ins"))),
                      extra, class_="diff")
    return el("pre", json.dumps(ctx, ensure_ascii=False, indent=1), class_="ctx")


def _kind(x: dict[str, Any]) -> str:
    return str(x.get("kind") or ("match" if x.get("match") else "divergence"))


def _compare_block(c: CompareResult, ids: Ids) -> Html:
    d = c.data
    prompts = [x for x in d.get("prompts", []) if isinstance(x, dict)]
    rate = d.get("exact_match_rate")
    rate_s = f"{100 * rate:.1f}%" if isinstance(rate, (int, float)) else "\u2014"
    conf = d.get("num_confident_divergences")
    stats = el("dl", class_="stats", *[
        Html(el("dt", k) + el("dd", v, class_=cls)) for k, v, cls in (
            ("exact match", rate_s, None),
            ("prompts", fmt(d.get("num_prompts", len(prompts))), None),
            ("confident divergences", fmt(conf), "good" if conf == 0 else ("bad" if conf else None)),
            ("near ties", fmt(d.get("num_near_ties")), None),
        )])
    notes = []
    if c.foreign:
        notes.append(el("p", el("strong", "Not this report's run: "), c.foreign, class_="warn"))
    if d.get("token_comparable") is False:
        notes.append(el("p", "Not token-comparable: ", d.get("not_comparable_reason") or "(no reason given)", class_="warn"))
    warnings = d.get("warnings")
    if isinstance(warnings, list) and warnings:
        notes.append(el("ul", *[el("li", w) for w in warnings], class_="warn"))
    others = {k: v for k, v in d.items() if k not in _TOP_STATS and isinstance(v, (str, int, float, bool))
              and k not in ("kind", "version", "token_comparable", "not_comparable_reason")}
    if others:
        notes.append(el("p", join([f"{k}: {v}" for k, v in others.items()], " \u00b7 "), class_="muted small"))
    rows = []
    for x in prompts:
        kind = _kind(x)
        if kind == "match":
            continue
        text = c.output_text(x.get("prompt_id"), x.get("turn"))
        full = el("details", el("summary", "full output"), el("pre", _clip(text, MAX_TEXT), class_="ctx")) if text else ""
        why = " \u2014 ".join(str(v) for v in (x.get("reason"), x.get("explanation")) if v)
        gap = x.get("gap")
        ctx_ids, ctx = x.get("context_ids"), x.get("context")
        rows.append(el(
            "tr",
            el("td", el("code", x.get("prompt_id")), f" / {x.get('turn', 0)}"),
            el("td", el("span", kind.replace("_", " "), class_=f"badge {re.sub(r'[^a-z_]', '', kind)}"),
               el("div", why, class_="muted small") if why else ""),
            el("td", fmt(x.get("first_divergence")), class_="num"),
            el("td", fmt(float(gap), 3) if isinstance(gap, (int, float)) else fmt(gap), class_="num"),
            el("td", f"{fmt(x.get('baseline_len'))} / {fmt(x.get('output_len'))}", class_="num"),
            el("td", render_context(ctx_ids) if isinstance(ctx_ids, dict) else "", render_context(ctx), full),
            id=ids.make("div", f"{c.label}-{x.get('prompt_id')}-{x.get('turn', 0)}"),
        ))
    n_match = sum(1 for x in prompts if _kind(x) == "match")
    table = el("div", el("table", el("thead", el("tr", *[el("th", h) for h in (
        "prompt / turn", "kind", "first divergence (token)", "logit gap", "length baseline / run", "token diff")])),
        el("tbody", *rows), class_="grid diffs"), class_="table-wrap") if rows else ""
    summary = el("p", f"{n_match} of {len(prompts)} prompt turns match the baseline token for token" +
                 (". Differences:" if rows else "."))
    return el("div", el("h3", c.label), el("p", el("code", c.source), class_="muted small"), stats, *notes, summary, table,
              class_="compare", id=ids.make("cmp", c.label))


_VERDICT_CLASS = {"lossless": "good", "near ties": "warn", "DIVERGES": "bad"}


def _judged_cells(j: dict[str, Any] | None) -> list[Html]:
    """identical / compared, near ties, confident divergences, verdict (with its note) of one judgement."""
    if j is None:
        return [el("td", "\u2014")] + [el("td", "")] * 3
    verdict = str(j.get("verdict") or "")
    note = j.get("note") if verdict not in ("lossless",) else None
    ex = j.get("examples") or []
    return [el("td", f"{fmt(j.get('exact_match'))} / {fmt(j.get('compared'))}", class_="num"),
            el("td", fmt(j.get("near_ties")), class_="num"),
            el("td", fmt(j.get("divergences")), class_="num"),
            el("td", el("strong", verdict, class_=_VERDICT_CLASS.get(verdict)),
               el("div", _clip("; ".join(str(x) for x in [*ex, note] if x), MAX_CELL), class_="muted small") if (note or ex) else "")]


def _sweep_verdict(points: list[Point], against: str) -> Html:
    """The one-paragraph answer to "is it correct" over the judged points."""
    js = [(p, p.judgement(against)) for p in points]
    js = [(p, j) for p, j in js if j is not None]
    what = "the AR point of the same sweep and settings" if against == "ar" else "the baseline"
    tot = {k: sum(int(j.get(k) or 0) for _, j in js) for k in ("compared", "exact_match", "near_ties", "divergences")}
    bad = [p for p, j in js if j.get("verdict") == "DIVERGES"]
    if bad:
        return el("p", el("strong", f"Not correct: {len(bad)} of {len(js)} points confidently diverge from {what}"),
                  f" ({tot['divergences']} prompt turns where the reference was confident: a bug until shown otherwise; "
                  f"{', '.join(p.config_label for p in bad)}). The sweep exited 1.", class_="bad-text")
    skipped = [p for p, j in js if j.get("verdict") not in ("lossless", "near ties")]
    head = ("Correct: every judged point emits exactly the greedy tokens of " + what if tot["near_ties"] == 0 and not skipped
            else "No confident divergence from " + what)
    tail = (f": {tot['exact_match']} of {tot['compared']} prompt turns identical token for token"
            + (f", {tot['near_ties']} near ties (shown below, not failed)" if tot["near_ties"] else "")
            + (f"; {len(skipped)} points not judged (see the verdict column)" if skipped else "") + ".")
    return el("p", el("strong", head), tail, class_="good-text" if head.startswith("Correct") else "warn")


def section_sweep_correctness(data: ReportData, ids: Ids, anchors: dict[int, str]) -> list[Html]:
    """A sweep's own answer: each DFlash/DDTree point vs its AR point (and every point vs --baseline)."""
    out: list[Html] = []
    for against, title in (("ar", "Greedy outputs vs the sweep's AR point"), ("baseline", "Greedy outputs vs the baseline")):
        pts = [p for p in data.points if p.judgement(against) is not None]
        if not pts:
            continue
        head = el("tr", *[el("th", h) for h in ("point", "configuration", "load", "identical / compared", "near ties",
                                                 "confident divergences", "verdict")])
        rows = [el("tr", el("td", el("a", el("code", p.id), href=f"#{anchors[id(p)]}")), el("td", p.config_label),
                   el("td", p.load_label + (f", T={p.temperature:g}" if p.temperature else "")),
                   *_judged_cells(p.judgement(against)), class_="failed" if (p.judgement(against) or {}).get("verdict") == "DIVERGES" else None)
                for p in pts]
        out += [el("h3", title), _sweep_verdict(pts, against),
                el("div", el("table", el("thead", head), el("tbody", *rows), class_="grid"), class_="table-wrap")]
        for p in pts:  # the differences, prompt by prompt, where there are any
            doc = p.sweep_compares.get(against)
            if doc and any(_kind(x) != "match" for x in doc.get("prompts", []) if isinstance(x, dict)):
                out.append(_compare_block(CompareResult(f"{p.id} ({p.config_label}) vs {'AR' if against == 'ar' else 'the baseline'}",
                                                        str(p.path / f"compare_{against}.json") if p.path else "", doc, p), ids))
    if out:
        out.insert(0, el("p", "Speculative decoding is lossless: at T = 0 every DFlash and DDTree point must emit the AR "
                              "point's greedy tokens. The sweep compares them with ", el("code", "ddtree-bench compare"),
                         "'s rule: a near tie (the reference's top-1 and top-2 logits closer than the near-tie gap; "
                         "numerics can flip it) is shown, not failed; a confident divergence fails the sweep (exit 1). "
                         "T > 0 points are not token-diffed (equal only in distribution).", class_="muted"))
    return out


def section_correctness(data: ReportData, ids: Ids, anchors: dict[int, str] | None = None) -> Html:
    intro = el("p", "Greedy outputs against the baseline, from ", el("code", "ddtree-bench compare --json"),
               ". A near tie is a divergence where the baseline's top-1 and top-2 logits were closer than the "
               "near-tie gap (numerics can flip it); a confident divergence is a correctness bug until shown "
               "otherwise. The token diff shows the tokens before the divergence plain, the baseline's continuation "
               "struck out and the run's underlined (token ids when compare recorded them, then the text).", class_="muted")
    swept = section_sweep_correctness(data, ids, anchors or {id(p): "" for p in data.points})
    if not data.compares and not swept:
        body = el("p", "No compare results in these inputs. Run ", el("code", "ddtree-bench compare RUN --baseline FILE --json > compare.json"),
                  " and pass ", el("code", "--compare compare.json"), ", or leave compare.json in the run directory. "
                  "(A sweep judges its own points against its AR point.)")
        return el("section", el("h2", "Correctness"), body, id="correctness")
    given = [intro, *[_compare_block(c, ids) for c in data.compares]] if data.compares else []
    return el("section", el("h2", "Correctness"), *swept, *given, id="correctness")


def section_requests(p: Point) -> Html:
    recs = p.records or []
    if not recs:
        return Html("")
    rows = []
    for r in recs[:MAX_REQUEST_ROWS]:
        tau = metrics.request_tau(r.accept_lengths)
        out = el("details", el("summary", _clip(r.output_text.replace("\n", " "), 60) or "(empty)"),
                 el("pre", _clip(r.output_text, MAX_TEXT), class_="ctx")) if r.output_text else "\u2014"
        rows.append(el(
            "tr", el("td", el("code", r.prompt_id)), el("td", r.turn, class_="num"), el("td", r.finish_reason or "\u2014"),
            el("td", fmt(r.num_prompt_tokens), class_="num"), el("td", fmt(r.num_output_tokens), class_="num"),
            el("td", fmt(len(r.accept_lengths) if r.accept_lengths else None), class_="num"),
            el("td", fmt(tau), class_="num"), el("td", fmt(metrics.ttft_ms(r), 1), class_="num"),
            el("td", fmt(metrics.e2e_ms(r), 1), class_="num"), el("td", out, class_="out"),
            el("td", _clip(r.error, MAX_CELL), class_="err", title=r.error), class_="failed" if r.error else None))
    more = el("p", f"Showing the first {MAX_REQUEST_ROWS} of {len(recs)} requests.", class_="muted") if len(recs) > MAX_REQUEST_ROWS else ""
    head = el("tr", *[el("th", h) for h in ("prompt", "turn", "finish", "prompt tok", "output tok", "rounds", "\u03c4",
                                             "TTFT ms", "E2E ms", "output", "error")])
    return el("section", el("h2", "Requests"), more,
              el("div", el("table", el("thead", head), el("tbody", *rows), class_="grid requests"), class_="table-wrap"), id="requests")


def _sources_line(data: ReportData) -> str:
    runs = sum(1 for s in data.sources if s.kind == "run")
    sweeps = [s for s in data.sources if s.kind == "sweep"]
    parts = []
    if sweeps:
        parts.append(f"{len(sweeps)} sweep{'s' if len(sweeps) > 1 else ''} ({sum(len(s.points) for s in sweeps)} points)")
    if runs:
        parts.append(f"{runs} run{'s' if runs > 1 else ''}")
    return " and ".join(parts)


def default_title(data: ReportData) -> str:
    if len(data.sources) == 1:
        s: Source = data.sources[0]
        return f"ddtree-bench {s.kind}: {s.path.name}"
    return f"ddtree-bench report: {_sources_line(data)}"


def render(data: ReportData, figures: list[Figure], title: str | None = None) -> str:
    """The whole page."""
    title = title or default_title(data)
    ids = Ids()
    for fixed in ("metadata", "takeaways", "headline", "plots", "correctness", "sampling", "explain", "requests", *(f.id for f in figures)):
        ids.used.add(fixed)
    anchors = {id(p): ids.make("pt", p.id) for p in data.points}
    generated = datetime.now(timezone.utc).isoformat(timespec="seconds")
    takeaways = section_takeaways(data, anchors)
    nav_items = [("metadata", "Run metadata")] + ([("takeaways", "Takeaways")] if takeaways else []) + [
        ("headline", "Headline numbers"), ("plots", "Plots"), ("correctness", "Correctness")]
    sampled = section_sampling(data)
    if sampled:
        nav_items.append(("sampling", "Sampling"))
    explained = section_explain(data)
    if explained:
        nav_items.append(("explain", "Acceptance gap"))
    if data.is_single_run and data.points[0].records:
        nav_items.append(("requests", "Requests"))
    nav = el("nav", el("ul", *[el("li", el("a", t, href=f"#{a}")) for a, t in nav_items]))
    body = [
        el("header", el("h1", title), el("p", f"{_sources_line(data)} \u00b7 generated {generated} by ddtree-bench {__version__}",
                                           class_="muted")),
        nav, section_metadata(data), takeaways, section_headline(data, anchors), section_plots(figures, data),
        section_correctness(data, ids, anchors), sampled, explained,
        section_requests(data.points[0]) if data.is_single_run else "",
        el("footer", el("p", "Inputs: ", join([el("code", s.path) for s in data.sources], ", "),
                        ". This page is self-contained: no scripts, no fonts or images from the network.", class_="muted")),
    ]
    head = Html(
        '<meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="generator" content="ddtree-bench">'
        + el("title", title) + el("style", Html(_css()))
    )
    return "<!DOCTYPE html>\n" + el("html", el("head", head), el("body", el("main", *body)), lang="en") + "\n"
