"""A sweep's concurrency axis, as the user sees it: the console table, summary.csv and summary.json.

An in-process sweep at c = 1, 2 with repeats runs the batched engine, so every loaded row (per repeat
and aggregate) says honoured, with its batch fill and its throughput ratio vs AR at the same load.
When the c = 2 points are marked not honoured (as a serial server's would be), `--resume` shows it:
NO in the table with the why beneath, `no takeaway (c=2)` instead of a verdict, summary.json's
`no_takeaway`, and aggregate rows that are not honoured because a repeat was not.
"""

from __future__ import annotations

import json

import pytest

from ddtree_bench.results import read_json
from process_support import csv_rows, run_cli

WHY = "the server runs one request at a time (its /server_info max_batch = 1)"
GRID = ["sweep", "--models", "random", "--suites", "smoke", "--methods", "ar,ddtree", "--budgets", "4",
        "--concurrency", "1,2", "--limit", "2", "--max-new-tokens", "6", "--repeats", "2", "--no-report", "-q"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("conc") / "sw"
    assert run_cli([*GRID, "--out", str(out)]) == 0
    return out


def _f(v):
    return float(v) if v not in (None, "") else None


def test_in_process_loads_are_honoured_with_fill_and_throughput_ratio(sweep, capsys):
    rows = csv_rows(sweep)
    assert len(rows) == 8 + 4  # 8 points (2 repeats) + one aggregate row per configuration
    for r in rows:
        assert r["concurrency_honoured"] == "True", r
        assert _f(r["batch_size_max"]) <= int(r["concurrency"])
    agg = {(r["method"], r["concurrency"]): r for r in rows if r["repeat"] == "all"}
    for (method, c), r in agg.items():
        ar = agg[("ar", c)]
        assert _f(r["throughput_ratio_vs_ar"]) == pytest.approx(_f(r["output_throughput_tok_s"]) / _f(ar["output_throughput_tok_s"]))
        reps = [_f(x["batch_size_mean"]) for x in rows if x["method"] == method and x["concurrency"] == c and x["repeat"] != "all"]
        assert _f(r["batch_size_mean"]) == pytest.approx(sum(reps) / len(reps))
    assert _f(agg[("ar", "2")]["batch_size_max"]) == 2  # AR requests of equal length share every round
    capsys.readouterr()
    assert run_cli(["sweep", "--resume", str(sweep), "--no-report", "-q"]) == 0
    out = capsys.readouterr().out
    assert "load honoured" in out and "tok/s x AR" in out and "NOT honoured" not in out and "no takeaway" not in out
    assert read_json(sweep / "summary.json")["no_takeaway"] == []


def test_a_load_that_was_not_honoured_is_flagged_everywhere_and_gets_no_takeaway(sweep, capsys):
    for d in (sweep / "points").iterdir():
        s = json.loads((d / "summary.json").read_text())
        if s["concurrency_requested"] == 2:
            s.update(concurrency_honoured=False, concurrency_why=WHY)
            (d / "summary.json").write_text(json.dumps(s))
    capsys.readouterr()
    assert run_cli(["sweep", "--resume", str(sweep), "--no-report", "-q"]) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith(("ar ", "ddtree "))]
    assert len(table) == 4  # the aggregate rows
    for line in table:
        assert (" NO " in line) == (line.split()[2] == "2"), line
    assert f"NOT honoured (inprocess, c=2): {WHY}." in out
    takeaways = [line for line in out.splitlines() if line.startswith(("takeaway", "no takeaway"))]
    assert [t.split(":")[0] for t in takeaways] == ["takeaway (c=1)", "no takeaway (c=2)"]
    assert takeaways[1] == f"no takeaway (c=2): concurrency 2 not honoured (ar, ddtree B=4): {WHY}"
    doc = read_json(sweep / "summary.json")
    assert [t["settings"] for t in doc["takeaways"]] == ["c=1"]
    assert doc["no_takeaway"] == [{"settings": "c=2", "why": f"concurrency 2 not honoured (ar, ddtree B=4): {WHY}"}]
    for r in csv_rows(sweep):
        assert r["concurrency_honoured"] == ("False" if r["concurrency"] == "2" else "True"), r
        assert (r["concurrency_why"] == WHY) == (r["concurrency"] == "2")
