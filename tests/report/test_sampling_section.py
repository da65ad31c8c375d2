"""The report's Sampling section (report/sampling_section.py): the u histogram of a T > 0 compare result,
the verdict line, 'not judged' with its reason, and no section at all when no compare has a distribution."""

from __future__ import annotations

import base64
import re

import pytest

import report_fixtures as rf
from ddtree_bench.report import render_report

HOSTILE = "<script>alert(1)</script>"


def _doc(distribution: dict | None) -> dict:
    return {"exact_match_rate": None, "num_prompts": 1, "num_confident_divergences": None, "num_near_ties": None,
            "prompts": [{"prompt_id": "p", "turn": 0, "match": None, "kind": "sampled"}], "distribution": distribution}


GREEDY = {"judged": True, "reason": "scored", "temperature": 1.0, "top_p": 1.0, "num_requests": 12, "num_tokens": 576,
          "statistic": 0.1385, "d_plus": 0.1385, "d_minus": 0.002, "p_value": 4.3e-10, "p_method": "exact", "skew": "low",
          "mean_u": 0.415, "histogram": [36, 52, 43, 47, 44, 26, 30, 20, 30, 33, 29, 24, 15, 32, 19, 24, 20, 28, 19, 25],
          "warnings": [f"a warning {HOSTILE}"]}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return rf.run(tmp_path_factory.mktemp("sampling-report") / "r", "ar", limit=1)


def test_the_u_histogram_and_verdict_of_a_t1_compare(run):
    html = render_report([run], [_doc(GREEDY), _doc({"judged": False, "reason": f"server baseline {HOSTILE}",
                                                     "temperature": 0.7, "top_p": 0.9})])
    assert '<a href="#sampling">Sampling</a>' in html
    section = html[html.index('<section id="sampling">'):]
    section = section[: section.index("</section>")]
    assert "p = 4.3e-10" in section and "over 576 tokens of 12 requests" in section and "piles up on the left" in section
    uri = re.search(r'<img src="data:image/svg\+xml;base64,([^"]+)"', section)
    svg = base64.b64decode(uri.group(1)).decode()
    assert svg.count("<path") > 20 and "<script" not in svg  # 20 bars and the uniform line, drawn by matplotlib
    assert "not judged" in section and "T=0.7, top_p=0.9" in section
    assert HOSTILE not in section and "&lt;script&gt;" in section  # text from files is escaped


def test_no_section_without_a_distribution(run):
    html = render_report([run], [_doc(None)])
    assert 'id="sampling"' not in html and "#sampling" not in html
