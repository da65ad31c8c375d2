"""A report over runs of two target models keeps them apart: one takeaway per model (never one ranking of
both), a model column in the headline table, and plot groups per model, so no curve averages two models'
points into a tau no configuration reached."""

from __future__ import annotations

import json
import re
import shutil

import pytest

import report_fixtures as rf
from ddtree_bench.report import data as report_data
from ddtree_bench.report import render_report
from ddtree_bench.report.plots import _groups


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("two-models")
    made = [rf.run(root / "random-ar", "ar"), rf.run(root / "random-ddtree", "ddtree")]
    for src in list(made):   # the same runs, labelled as another target (its directory's name is what shows)
        dst = shutil.copytree(src, root / f"other-{src.name.split('-')[1]}")
        info = json.loads((dst / "run.json").read_text())
        info["spec"]["model"] = "/models/Other-7B"
        (dst / "run.json").write_text(json.dumps(info))
        made.append(dst)
    return made


def test_one_takeaway_per_model_and_a_model_column(runs):
    html = render_report(runs)
    section = html[html.index('<section id="takeaways">'):]
    section = section[: section.index("</section>")]
    heads = re.findall(r"<li>([^:<]+):", section)
    assert sorted(heads) == ["Other-7B, smoke, c=1", "random, smoke, c=1"], heads
    head = html[html.index('<section id="headline">'):]
    assert "<th title=\"the target model (its directory&#x27;s name)\">model</th>" in head[: head.index("</thead>")]
    assert "(random)" not in section and "(Other-7B)" not in section   # no label needs the model: the groups say it


def test_plot_groups_never_mix_models(runs):
    data = report_data.load(runs)
    groups, many = _groups(data.ok_points)
    assert many and sorted(groups) == ["Other-7B, smoke", "random, smoke"]
    assert all(len({p.model for p in pts}) == 1 for pts in groups.values())
    one = [p for p in data.ok_points if p.model == "random"]
    assert list(_groups(one)[0]) == ["smoke"]   # one model: the group is named by its suite alone, as before


def test_a_chart_that_draws_only_some_configurations_says_so(runs, monkeypatch):
    from ddtree_bench.report import plots

    data = report_data.load(runs)
    assert "Showing the first" not in plots.fig_accept_by_depth(data).caption
    monkeypatch.setattr(plots, "MAX_DEPTH_CURVES", 1)
    assert "Showing the first 1 of 2 configurations" in plots.fig_accept_by_depth(data).caption
