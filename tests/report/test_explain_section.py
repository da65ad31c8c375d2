"""The report's Acceptance gap section (report/explain_section.py): each run's explain.json as markup - headings,
the fix and the variants table as elements, not as escaped text - with text from files escaped once."""

from __future__ import annotations

from types import SimpleNamespace

from ddtree_bench.report.explain_section import section_explain

HOSTILE = "<script>alert(1)</script>"

EXPLAIN = {
    "verdict": {"status": "explained", "text": f"the server drafts causally {HOSTILE}", "fix": "use bidirectional"},
    "config_findings": [{"severity": "warning", "message": "causal drafter"}],
    "server": {"tau": 3.1, "rates_by_depth": [0.9, 0.7]}, "reference": {"tau": 3.6, "rates_by_depth": [0.95, 0.8]},
    "distance": 0.12,
    "variants": [{"name": "causal", "tau": 3.1, "distance": 0.01, "description": "causal mask",
                  "round_agreement": {"requests_identical": 2, "requests": 2}},
                 {"name": "fp16", "skipped": "needs a GPU"}],
}


def test_the_section_is_markup_and_file_text_is_escaped_once():
    data = SimpleNamespace(points=[SimpleNamespace(id="run-a", explain=EXPLAIN), SimpleNamespace(id="run-b", explain=None)])
    html = section_explain(data)
    assert html.startswith('<section id="explain">') and "<h3><code>run-a</code>" in html
    assert "<strong>Fix: </strong>use bidirectional" in html
    assert "<td><code>causal</code></td>" in html and "skipped: needs a GPU" in html
    assert "&lt;h3" not in html and "&lt;td" not in html and "&amp;lt;" not in html
    assert HOSTILE not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "run-b" not in html


def test_no_section_without_an_explain():
    assert section_explain(SimpleNamespace(points=[SimpleNamespace(id="r", explain=None)])) == ""
