"""`ddtree-bench report`: what the page contains, that hostile strings stay text, that nothing refers
to the network, how sweeps and runs are joined, and the command's exit codes.

Inputs are real run directories made with `ddtree-bench run --model random` (see report_fixtures).
"""

from __future__ import annotations

import base64
import csv
import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

import report_fixtures as rf
from ddtree_bench import metrics
from ddtree_bench.cli import main
from ddtree_bench.report import render_report
from ddtree_bench.report import data as rdata
from ddtree_bench.results import read_records

SWEEP_FIGURES = {"fig-tau-vs-budget", "fig-throughput-vs-budget", "fig-tree-use", "fig-accept-histogram",
                 "fig-accept-by-depth", "fig-latency-vs-concurrency", "fig-stage-split"}
RUN_FIGURES = {"fig-accept-histogram", "fig-accept-by-depth", "fig-stage-split"}
ALLOWED_TAGS = {"html", "head", "meta", "title", "style", "body", "main", "header", "nav", "ul", "li", "a", "section",
                "h1", "h2", "h3", "p", "div", "table", "thead", "tbody", "tr", "th", "td", "code", "pre", "span", "br",
                "figure", "img", "figcaption", "strong", "dl", "dt", "dd", "details", "summary", "del", "ins", "footer"}


@pytest.fixture(scope="session")
def fx(tmp_path_factory):
    return rf.build(tmp_path_factory.getbasetemp() / "report-fixtures")


class Page(HTMLParser):
    """Tags, attributes and text of a page, as a browser's parser sees them."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self._in_style = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        self._in_style = False

    def handle_data(self, data):
        if not self._in_style:
            self.text.append(data)

    @property
    def ids(self) -> list[str]:
        return [a["id"] for _, a in self.tags if a.get("id")]

    def all_text(self) -> str:
        return "".join(self.text)


def figure_ids(page: Page) -> set[str]:
    return {a["id"] for t, a in page.tags if t == "figure"}


# ---------------------------------------------------------------------------- content


def test_sweep_report_has_every_plot_with_a_caption(fx):
    html = render_report([fx.sweep])
    page = Page(html)
    assert figure_ids(page) == SWEEP_FIGURES  # no request-rate points, so no latency-vs-rate figure
    assert html.count("<figcaption>") == len(SWEEP_FIGURES)
    text = page.all_text()
    for heading in ("Run metadata", "Headline numbers", "Plots", "Correctness", "Takeaways"):
        assert heading in text
    # one headline row per grid point, plus the failed CSV row without a directory
    rows = [a for t, a in page.tags if t == "tr" and (a.get("id") or "").startswith("pt-")]
    assert len(rows) == 11
    assert any("failed" in (a.get("class") or "") for a in rows)
    assert "ddtree-bench sweep --model random --budgets 4,16,64 --concurrency 1,2" in text


def test_single_run_report_shows_its_histogram_depth_curve_and_stage_split_only(fx):
    page = Page(render_report([fx.run]))
    assert figure_ids(page) == RUN_FIGURES
    assert "requests" in page.ids  # per-request table for a single run
    text = page.all_text()
    assert "subset rule none" in text and "float32" in text and "ddtree B=16" in text


def test_points_with_stage_times_and_no_drafter_still_render(fx, tmp_path):
    """An AR-only input: no acceptance plots (all rounds are 1), but a stage split and a table."""
    page = Page(render_report([fx.ar_run]))
    assert figure_ids(page) == {"fig-stage-split"}


def test_open_loop_runs_get_latency_against_request_rate(fx):
    page = Page(render_report(fx.rate_runs))
    assert "fig-latency-vs-rate" in figure_ids(page) and "fig-latency-vs-concurrency" not in figure_ids(page)
    assert "20 req/s" in page.all_text() and "80 req/s" in page.all_text()


def test_a_run_whose_every_request_failed_is_listed_not_plotted(fx, tmp_path):
    run = tmp_path / "failed-run"
    shutil.copytree(fx.ar_run, run)
    (run / "summary.json").unlink()  # what the runner leaves when every request failed
    recs = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    for r in recs:
        r["error"] = "http 500: <script>x</script>"
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    page = Page(render_report([run, fx.sweep / "points" / "ar-c1"]))
    text = page.all_text()
    assert "2 of 2 requests failed; first: http 500: <script>x</script>" in text
    failed = [a for t, a in page.tags if t == "tr" and "failed" in (a.get("class") or "")]
    assert len(failed) == 1
    assert figure_ids(page) == {"fig-stage-split"}  # drawn from the AR run that worked; the failed one is left out


# ---------------------------------------------------------------------------- escaping and offline


def test_hostile_strings_show_as_text_and_ids_are_sanitised(fx):
    compare = json.loads(fx.compare.read_text())
    title = f"{rf.HOSTILE} & title"
    html = render_report([fx.run, fx.sweep], [compare], title=title)
    page = Page(html)
    tags = {t for t, _ in page.tags}
    assert tags <= ALLOWED_TAGS, tags - ALLOWED_TAGS
    assert "script" not in tags and "<script" not in html.lower()
    for tag, attrs in page.tags:
        assert not any(k.startswith("on") for k in attrs), (tag, attrs)
    text = page.all_text()
    assert rf.HOSTILE_ID in text            # a prompt id from the custom suite
    assert rf.HOSTILE_POINT in text         # a sweep point directory name
    assert f"server exited before ready: {rf.HOSTILE}" in text  # an error from summary.csv
    assert " <b>41</b>" in text             # a token of the compare context
    assert f"baselines/{rf.HOSTILE}.jsonl" in text
    assert title in text
    # ids: safe characters, unique, and every in-page link lands on one
    ids = page.ids
    assert all(re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", i) for i in ids), [i for i in ids if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", i)]
    assert len(ids) == len(set(ids))
    hrefs = [a["href"] for t, a in page.tags if t == "a"]
    assert hrefs and all(h.startswith("#") and h[1:] in ids for h in hrefs)


def test_page_refers_to_no_network_resource(fx):
    html = render_report([fx.sweep, fx.run], [json.loads(fx.compare.read_text())])
    assert "http://" not in html and "https://" not in html
    page = Page(html)
    assert not any(t in ("link", "script", "iframe", "object", "embed", "base") for t, _ in page.tags)
    assert "url(" not in html and "@import" not in html
    csp = next(a["content"] for t, a in page.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy")
    assert "default-src 'none'" in csp
    srcs = [a["src"] for t, a in page.tags if "src" in a]
    assert srcs and all(s.startswith("data:image/svg+xml;base64,") for s in srcs)
    for s in srcs:
        svg = base64.b64decode(s.split(",", 1)[1]).decode("utf-8")
        root = ET.fromstring(svg)  # a well-formed image
        assert root.tag.endswith("svg")
        # the only URLs left are the XML namespace names, which are identifiers and never fetched
        assert set(re.findall(r"https?://[^\s\"']+", svg)) <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}
        assert not re.search(r"(?:xlink:)?href=\"(?!#)", svg)


# ---------------------------------------------------------------------------- data joins


def test_speedup_of_separate_runs_comes_from_their_ar_partner(fx):
    pts = fx.sweep / "points"
    loaded = rdata.load([pts / "ar-c1", pts / "ddtree-b16-c1", pts / "dflash-c2"])
    by = {p.id: p for p in loaded.points}
    want = metrics.speedup_vs_ar(read_records(pts / "ddtree-b16-c1"), read_records(pts / "ar-c1"))
    assert by["ddtree-b16-c1"].values["speedup_vs_ar"] == pytest.approx(want)
    assert by["ar-c1"].values["speedup_vs_ar"] == 1.0
    assert by["dflash-c2"].values["speedup_vs_ar"] is None  # its AR point (c=2) is not among the inputs


def test_sweep_rows_join_points_by_settings_or_by_point_id(fx, tmp_path):
    loaded = rdata.load([fx.sweep])
    dirs = [p for p in loaded.points if p.path is not None]
    assert len(dirs) == 10 and all(p.csv_row is not None for p in dirs)
    for p in dirs:  # each row landed on the directory with the same settings
        assert p.csv_row["method"] == p.method and p.csv_row["concurrency"] == p.concurrency
        if p.method == "ddtree":
            assert p.csv_row["budget"] == p.budget
    # with a point_id column the join follows it, whatever the row order and values
    copy = tmp_path / "sweep"
    shutil.copytree(fx.sweep, copy)
    with open(copy / "summary.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    ids = sorted(d.name for d in (copy / "points").iterdir())
    rows = rows[: len(ids)]
    for i, (row, pid) in enumerate(zip(reversed(rows), ids)):
        row["point_id"], row["speedup_vs_ar"] = pid, str(10.0 + i)
    with open(copy / "summary.csv", "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*rf.CSV_COLUMNS, "point_id"])
        w.writeheader()
        w.writerows(reversed(rows))
    by = {p.id: p for p in rdata.load([copy]).points}
    assert [by[pid].values["speedup_vs_ar"] for pid in ids] == [10.0 + i for i in range(len(ids))]


def test_compare_results_render_as_a_token_diff(fx):
    """compare.json beside a run is picked up; its divergence shows the ids before it plain, then the
    baseline's struck out and the run's underlined, with the context text and the run's own output."""
    loaded = rdata.load([fx.run])
    assert [c.label for c in loaded.compares] == ["hostile-ddtree/compare.json"]
    html = render_report([fx.run], [json.loads(fx.compare.read_text())])
    text = Page(html).all_text()
    assert "50.0%" in text and "1 of 2 prompt turns match" in text and "1 of 3 prompt turns match" in text
    assert f"a warning with {rf.HOSTILE}" in text
    assert "full output" in text  # the run's own output text beside the diff
    row = html[html.index('id="div-hostile-ddtree-compare-json-p1'):]
    row = row[: row.index("</tr>")]
    assert re.search(r'<span class="tok">97</span><span class="tok">98</span><del><span class="tok">60</span>', row)
    assert '<ins><span class="tok">120</span>' in row
    assert "position 5" in Page(row).all_text()
    # the other shape: token pieces with a shared part computed from both sides
    other = html[html.index('id="div-compare-1-smoke-0-0"'):]
    other = other[: other.index("</tr>")]
    assert re.search(r'<span class="tok"> is</span><del><span class="tok"> 42</span>', other)
    assert re.search(r'<span class="tok"> is</span><ins><span class="tok"> &lt;b&gt;41&lt;/b&gt;</span>', other)


# ---------------------------------------------------------------------------- the command


def _cli(args: list[str], capsys) -> tuple[int, str]:
    try:
        main(args)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    return code, capsys.readouterr().err


def test_cli_writes_the_report_atomically(fx, tmp_path, capsys):
    out = tmp_path / "reports" / "r.html"
    code, err = _cli(["report", str(fx.sweep), str(fx.run), "--out", str(out), "--compare", str(fx.compare),
                      "--title", "T"], capsys)
    assert code == 0, err
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in out.parent.iterdir()) == ["r.html"]  # no temporary file left
    assert "compare-extra.json" in Page(out.read_text(encoding="utf-8")).all_text()


def test_a_compare_result_of_another_run_is_flagged_not_shown_as_this_ones(fx, tmp_path, capsys):
    """--compare of a run the report does not hold (its `run` names neither a given directory nor its name)
    carries a warning on the page and on stderr; one naming a given run is that run's, with no warning."""
    doc = {**json.loads(fx.compare.read_text()), "run": "results/x"}
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc))
    out = tmp_path / "r.html"
    code, err = _cli(["report", str(fx.run), "--out", str(out), "--compare", str(other)], capsys)
    assert code == 0 and f"warning: {other}: this compare result is of run results/x, which is not among" in err
    assert "Not this report&#x27;s run: " in out.read_text(encoding="utf-8")
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({**doc, "run": str(fx.ar_run)}))
    code, err = _cli(["report", str(fx.run), str(fx.ar_run), "--out", str(out), "--compare", str(mine)], capsys)
    assert code == 0 and "warning" not in err and "Not this report" not in out.read_text(encoding="utf-8")


def _corrupt(kind: str, fx, tmp: Path) -> list[str]:
    """Arguments (inputs and flags) that are bad in one way."""
    run = tmp / "run"
    if kind in ("summary", "records", "records-shape", "run-json", "csv"):
        shutil.copytree(fx.sweep if kind == "csv" else fx.run, run)
    if kind == "missing":
        return [str(tmp / "nope")]
    if kind == "not-results":
        (tmp / "empty").mkdir()
        return [str(tmp / "empty")]
    if kind == "a-file":
        (tmp / "f.txt").write_text("x")
        return [str(tmp / "f.txt")]
    if kind == "summary":
        (run / "summary.json").write_text("{not json")
    if kind == "records":
        with open(run / "records.jsonl", "a") as f:
            f.write("{broken\n")
    if kind == "records-shape":
        with open(run / "records.jsonl", "a") as f:
            f.write("[1, 2]\n")
    if kind == "run-json":
        (run / "run.json").write_text("[]")
    if kind == "csv":
        with open(run / "summary.csv", "a") as f:
            f.write("inprocess,random,ddtree,16,extra,columns,,,,,,,,,,,,,,,,,,,,,,\n")
    if kind == "twice":   # the same run given twice (once through another spelling of its path)
        return [str(fx.run), str(fx.run) + "/"]
    if kind in ("compare-bad-json", "compare-shape", "compare-missing"):
        path = tmp / "c.json"
        if kind != "compare-missing":
            path.write_text("{" if kind == "compare-bad-json" else json.dumps({"exact_match_rate": 1.0}))
        return [str(fx.run), "--compare", str(path)]
    return [str(run)]


@pytest.mark.parametrize("kind", ["missing", "not-results", "a-file", "summary", "records", "records-shape", "run-json",
                                  "csv", "compare-bad-json", "compare-shape", "compare-missing", "twice"])
def test_cli_bad_input_exits_2_and_writes_nothing(kind, fx, tmp_path, capsys):
    out = tmp_path / "out" / "r.html"
    args = _corrupt(kind, fx, tmp_path)
    code, err = _cli(["report", *args, "--out", str(out)], capsys)
    assert code == 2, err
    assert err.startswith("error: ") and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_cli_bad_input_keeps_an_existing_report(fx, tmp_path, capsys):
    out = tmp_path / "r.html"
    out.write_text("previous report")
    code, _ = _cli(["report", str(tmp_path / "nope"), "--out", str(out)], capsys)
    assert code == 2 and out.read_text() == "previous report"
    code, _ = _cli(["report", str(fx.run), "--out", str(tmp_path)], capsys)  # --out is a directory
    assert code == 2


def test_cli_help_does_not_import_matplotlib():
    code = ("import sys; from ddtree_bench.cli import app; import ddtree_bench.cli.report; "
            "assert 'matplotlib' not in sys.modules and 'torch' not in sys.modules, 'heavy import'")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------- intervals and noise (issue 22)


def _takeaways_text(html: str) -> str:
    section = re.search(r'<section id="takeaways">.*?</section>', html, flags=re.S)
    assert section is not None, "no takeaways section"
    return Page(section.group(0)).all_text()


def test_takeaways_name_a_winner_only_when_its_interval_clears_the_runner_up(fx):
    from ddtree_bench.report import html as rhtml
    from ddtree_bench.stats import Interval

    data = rdata.load([fx.sweep])
    c1 = [c for c in data.configs if c.first.load_label == "c=1"]
    assert {c.label for c in c1} == {"ar", "dflash", "ddtree B=4", "ddtree B=16", "ddtree B=64"}
    for c in data.configs:  # known intervals: at c=1 B=64 is clear of the rest; at c=2 B=16 and B=64 overlap
        est = {"ar": 1.0, "dflash": 1.2, "ddtree B=4": 1.3, "ddtree B=16": 1.5, "ddtree B=64": 2.0}[c.label]
        h = 0.0 if c.label == "ar" else (0.3 if c.first.load_label == "c=2" and c.label in ("ddtree B=16", "ddtree B=64") else 0.05)
        if c.first.load_label == "c=2" and c.label == "ddtree B=16":
            est = 1.8
        c.speedup, c.speedup_value = Interval(est, est - h, est + h, 0.95, "test", 2), est
    text = _takeaways_text(rhtml.render(data, []))
    assert "smoke, c=1: fastest is ddtree B=64 (2.00× vs AR [1.95, 2.05])" in text
    assert "smoke, c=2: no single fastest: ddtree B=64, ddtree B=16 are indistinguishable" in text
    assert "repeats would separate ddtree B=64 from ddtree B=16" in text
    assert "speedup vs AR [95% CI]" in text and "2.00× [1.95, 2.05]" in text
    bold = [a.get("id") for t, a in Page(rhtml.render(data, [])).tags if t == "tr" and "best" in (a.get("class") or "")]
    assert len([b for b in bold if b and b.startswith("pt-")]) == 1  # only the c=1 winner's headline row is bold


def test_single_repeat_points_get_a_speedup_interval_from_their_records(fx):
    data = rdata.load([fx.sweep])
    for c in data.configs:
        assert c.speedup is not None and c.speedup.low <= c.speedup_value <= c.speedup.high
        assert c.tok_s is None  # one repeat: no throughput interval
        if c.method == "ar":
            assert (c.speedup.low, c.speedup.high) == (pytest.approx(1.0), pytest.approx(1.0))


@pytest.mark.slow
def test_a_sweep_with_repeats_reports_intervals_error_bars_and_heavy_load(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "sw"
    main_argv = ["sweep", "--models", "random", "--suites", "smoke", "--methods", "ddtree", "--budgets", "8,32",
                 "--limit", "3", "--max-new-tokens", "5", "--repeats", "2", "--out", str(out), "--no-report", "-q"]
    try:
        main(main_argv)
    except SystemExit as e:
        assert e.code == 0
    for d in (out / "points").iterdir():  # one point under heavy load, the rest quiet (whatever this machine did)
        heavy = "-b32-" in d.name and "rep1" in d.name
        status = json.loads((d / "status.json").read_text())
        status["noise"].update(heavy_load=heavy, other_cpu_share=0.9 if heavy else 0.1)
        (d / "status.json").write_text(json.dumps(status))
    html = render_report([out])
    text = Page(html).all_text()
    takeaways = _takeaways_text(html)
    assert ("fastest is" in takeaways) != ("indistinguishable" in takeaways)
    assert "1 of 6 measured points ran under heavy load" in takeaways and "1 of 2" in takeaways
    assert "heavy machine load (other processes used 90% of the CPU cores)" in text
    assert "Error bars (and shaded bands around the DFlash / AR lines) are 95% confidence intervals" in text
    data = rdata.load([out])
    assert len(data.points) == 6 and len(data.configs) == 3  # aggregate rows are not points of their own
    b8 = next(c for c in data.configs if c.label == "ddtree B=8")
    assert b8.repeats == 2 and b8.tok_s is not None and b8.speedup is not None
    agg = next(r for s in data.sources for r in s.aggregates if r["method"] == "ddtree" and r["budget"] == 8.0)
    assert b8.speedup.low == pytest.approx(agg["speedup_vs_ar_ci_low"])  # the file's interval, not recomputed


def test_a_load_the_backend_did_not_honour_gives_no_takeaway(fx):
    from ddtree_bench.report import html as rhtml

    data = rdata.load([fx.sweep])
    before = {key for key, _ in rhtml.verdicts(data)}
    assert ("random", "smoke", 0.0, "c=2") in before
    for p in data.points:
        if p.load_label == "c=2" and p.summary is not None:
            p.summary = {**p.summary, "concurrency_honoured": False}
    after = {key for key, _ in rhtml.verdicts(data)}
    assert after == before - {("random", "smoke", 0.0, "c=2")}


def _headline_rows(html: str) -> list[dict[str, str]]:
    """The headline table as {column header: cell text} per grid-point row."""
    section = re.search(r'<section id="headline">.*?</section>', html, flags=re.S).group(0)
    head = [Page(c).all_text() for c in re.findall(r"<th[^>]*>(.*?)</th>", section, flags=re.S)]
    out = []
    for tr in re.findall(r'<tr id="pt-[^"]*"[^>]*>(.*?)</tr>', section, flags=re.S):
        cells = [Page(c).all_text() for c in re.findall(r"<td[^>]*>(.*?)</td>", tr, flags=re.S)]
        out.append(dict(zip(head, cells)))
    return out


def _captions(html: str) -> dict[str, str]:
    return {fid: Page(cap).all_text() for fid, cap in
            re.findall(r'<figure id="([^"]+)">.*?<figcaption>(.*?)</figcaption>', html, flags=re.S)}


def test_loaded_points_show_the_throughput_ratio_batch_fill_and_that_their_load_was_honoured(fx):
    from ddtree_bench.report import html as rhtml
    from ddtree_bench.report import plots as rplots

    data = rdata.load([fx.sweep])
    html = rhtml.render(data, rplots.make_figures(data))
    rows = [r for r in _headline_rows(html) if r.get("status", "ok") == "ok" and r["τ"] != "\u2014"]
    ar_tok_s = {p.load_label: p.values["tok_s"] for p in data.points if p.method == "ar" and p.ok}
    for p, r in zip([p for p in data.points if p.ok], rows):
        assert r["point"] == p.id
        # in-process points run the batched engine at c=2 (summary.json says honoured; batch sizes recorded)
        assert r["load honoured"] == ("yes" if p.concurrency == 2 else "")
        assert r["tok/s \u00d7 AR"] == f"{p.values['tok_s'] / ar_tok_s[p.load_label]:.2f}\u00d7"
        assert r["batch fill"] == f"{p.summary['batch_size_mean']:.1f} / {p.summary['batch_size_max']}"
    assert "no takeaway" not in _takeaways_text(html)
    assert all("not honoured" not in c for c in _captions(html).values())


def test_a_load_that_was_not_honoured_is_said_in_the_table_takeaways_and_captions(fx):
    from ddtree_bench.report import html as rhtml
    from ddtree_bench.report import plots as rplots

    data = rdata.load([fx.sweep])
    why = "the server runs one request at a time (its /server_info max_batch = 1)"
    for p in data.points:
        if p.load_label == "c=2" and p.summary is not None:
            p.summary = {**p.summary, "concurrency_honoured": False, "concurrency_why": why}
    html = rhtml.render(data, rplots.make_figures(data))
    for r in _headline_rows(html):
        if r["load"] == "c=2" and r["τ"] != "\u2014":
            assert r["load honoured"] == "NO" and f"concurrency not honoured: {why}" in r["note"], r
        elif r["load"] == "c=1":
            assert r["load honoured"] == "" and "not honoured" not in r.get("note", "")
    takeaways = _takeaways_text(html)
    assert "smoke, c=2: no takeaway" in takeaways and why in takeaways
    assert "smoke, c=1: " in takeaways          # the honoured load keeps its verdict
    assert takeaways.count("c=2") == 1          # ... and c=2 is in no ranking table
    caps = _captions(html)
    assert "points at c=2 whose backend did not honour the concurrency" in caps["fig-latency-vs-concurrency"]
    assert "no trend across load should be read from them" in caps["fig-latency-vs-concurrency"]
    assert "not honoured\u2019 (c=2)" in caps["fig-throughput-vs-budget"]


def test_every_histogram_panel_keeps_its_x_tick_labels_on_every_row(fx, monkeypatch):
    """Issue 33: with two rows of panels, sharex hid the numbers of the top row."""
    from ddtree_bench.report import plots

    d = rdata.load([fx.sweep])
    entries = plots._config_entries(d.ok_points)
    many = [(f"{lbl} #{i}", ps) for i in range(2) for lbl, ps in entries][:6]  # 6 panels: 4 on top, 2 below
    monkeypatch.setattr(plots, "_config_entries", lambda points, with_ar=False: many)
    figs = []
    monkeypatch.setattr(plots, "_to_uri", lambda fig: figs.append(fig) or "data:image/png;base64,")
    assert plots.fig_accept_histogram(d) is not None
    (fig,) = figs
    fig.canvas.draw()
    panels = [a for a in fig.axes if a.get_visible()]
    assert len(panels) == 6
    for ax in panels:
        labels = [t.get_text() for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        assert labels == ["1", "4", "8", "12", "16"], (ax.get_title(), labels)


def test_a_sweeps_correctness_section_answers_is_it_correct(tmp_path):
    """The default sweep report says whether the outputs are correct (no compare file needed), and a
    two-run report's configurations that differ only by backend say which is which."""
    out = tmp_path / "sw"
    assert main_rc(["sweep", "--models", "random", "--suites", "smoke", "--methods", "dflash", "--limit", "2",
                    "--max-new-tokens", "6", "-q", "--no-report", "--out", str(out)]) == 0
    page = render_report([out])
    section = page[page.index('id="correctness"'):]
    assert "No compare results" not in section
    assert "Correct: every judged point emits exactly the greedy tokens of the AR point" in section
    assert "2 of 2 prompt turns identical" in section and "lossless" in section


def test_configurations_that_differ_only_by_backend_or_run_are_labelled_apart(fx, tmp_path):
    from ddtree_bench.report.data import Config, disambiguate

    d = rdata.load([fx.sweep])
    p = next(q for q in d.ok_points if q.method == "ddtree")
    twin = rdata.Point(**{**p.__dict__, "spec": {**p.spec, "backend": "standalone"}, "values": dict(p.values)})
    third = rdata.Point(**{**p.__dict__, "source": str(tmp_path / "run-b"), "values": dict(p.values)})
    two = [Config(p.config_label, [p]), Config(p.config_label, [twin])]
    disambiguate(two)
    assert [c.label for c in two] == [f"{p.config_label} (inprocess)", f"{p.config_label} (standalone)"]
    three = [Config(p.config_label, [p]), Config(p.config_label, [twin]), Config(p.config_label, [third])]
    disambiguate(three)
    assert [c.label for c in three] == [f"{p.config_label} (inprocess, sweep-demo)", f"{p.config_label} (standalone, sweep-demo)",
                                        f"{p.config_label} (inprocess, run-b)"]


def main_rc(argv) -> int:
    try:
        main(argv)
    except SystemExit as e:
        return e.code
    return 0


def test_a_point_timed_on_a_power_capped_gpu_says_so_in_its_note(fx, tmp_path):
    """summary.csv's gpu_power_capped_share / gpu_sm_clock_mhz_during (noise/probe.py samples the GPUs all through a
    point): at least half its samples at the power cap puts the share and the median SM clock in the point's note; a
    point under that says nothing. (A point's status.json `noise.gpu_during` is read first where there is one.)"""
    import csv
    import shutil

    sw = tmp_path / "sw"
    shutil.copytree(fx.sweep, sw)
    with open(sw / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    fields = list(rows[0]) + ["gpu_sm_clock_mhz_during", "gpu_power_capped_share"]
    for row, share in zip(rows, ("0.91", "0.2")):
        row.update(gpu_sm_clock_mhz_during="1530", gpu_power_capped_share=share)
    with open(sw / "summary.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        w.writerows(rows)
    notes = [r.get("note", "") for r in _headline_rows(render_report([sw]))]
    assert sum("GPU at its power cap on 91% of samples (median SM clock 1,530 MHz)" in n for n in notes) == 1
    assert not any("20% of samples" in n for n in notes)
    data = rdata.load([sw])
    assert sorted(p.gpu_power_capped_share for p in data.points if p.gpu_power_capped_share is not None) == [0.2, 0.91]
    p = next(p for p in data.points if p.gpu_power_capped_share == 0.2)
    p.noise = {"gpu_during": {"power_capped_share": 0.6, "sm_clock_mhz_median": 1400.0}}   # status.json wins
    assert p.gpu_capped and p.gpu_sm_clock_mhz == 1400.0
