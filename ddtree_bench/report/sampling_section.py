"""The report's "Sampling" section: for T > 0 runs, the histogram of the randomised PIT u that
`compare` tested (`distribution` in `compare --json`; verdict/distribution.py), one per compare result.

u is uniform on [0, 1] exactly when the server samples from the target's tempered distribution, so
the bars should be flat around the dashed line (n / bins); greedy or too-cold sampling piles them
on the left, too-hot sampling on the right. Drawn as the report's other figures are (an SVG `data:` image).
Knows the `distribution` section's keys and the report's markup helpers; nothing of engines.
"""

from __future__ import annotations

from typing import Any

from ddtree_bench.report.markup import Html, el, esc
from ddtree_bench.verdict.distribution import FALSE_ALARM_RATE

def u_histogram_uri(counts: list[int]) -> str:
    """The u histogram as the report draws its figures (matplotlib -> SVG -> data: URI): bars over [0, 1]
    and a dashed line at the uniform expectation n / bins."""
    from ddtree_bench.report.plots import _new, _to_uri

    n, bins = sum(counts), max(len(counts), 1)
    fig, axes = _new(w=5.0, h=2.2)
    ax = axes[0][0]
    ax.bar([(i + 0.5) / bins for i in range(len(counts))], counts, width=0.9 / bins, color="#4a7bb7")
    ax.axhline(n / bins, color="#333333", linestyle="--", linewidth=1)
    ax.set_xlim(0, 1)
    ax.set_xlabel("u (0: the most likely tokens, 1: the least)")
    ax.set_ylabel("tokens")
    return _to_uri(fig)


def _block(label: str, d: dict[str, Any]) -> Html:
    head = f"T={d.get('temperature')}" + (f", top_p={d.get('top_p')}" if (d.get("top_p") or 1) < 1 else "")
    if not d.get("judged"):
        return el("div", el("h3", el("code", label), f" \u2014 {head}: not judged"), el("p", d.get("reason") or ""), class_="warn")
    p = d.get("p_value")
    text = (f"KS D = {d.get('statistic', 0):.4f} over {d.get('num_tokens')} tokens of {d.get('num_requests')} requests, "
            f"p = {p:.3g} ({d.get('p_method')}); mean u {d.get('mean_u', 0):.3f} (0.5 when sampled right).")
    if p is not None and p < FALSE_ALARM_RATE:
        text += " " + ("u piles up on the left: greedy or too-cold sampling?" if d.get("skew") == "low"
                       else "u piles up on the right: too-hot sampling, or top-p ignored?")
    counts = list(d.get("histogram") or [])
    alt = f"histogram of u over {sum(counts)} tokens in {len(counts)} bins against the uniform line"
    fig = el("figure", Html(f'<img src="{esc(u_histogram_uri(counts))}" alt="{esc(alt)}">'),
             el("figcaption", "u histogram: flat at the dashed line when the server samples right."))
    return el("div", el("h3", el("code", label), f" \u2014 {head}"), el("p", text), fig,
              *(el("p", w, class_="muted") for w in d.get("warnings") or []))


def section_sampling(data: Any) -> str:
    """'' when no compare result carries a distribution section (T = 0 runs have none)."""
    blocks = [_block(c.label, c.data["distribution"]) for c in data.compares if isinstance(c.data.get("distribution"), dict)]
    if not blocks:
        return ""
    intro = el("p", "T > 0 outputs equal greedy decoding only in distribution, so ", el("code", "ddtree-bench compare"),
               " scores every emitted token under the target's tempered distribution and tests the randomised probability "
               f"integral transform u for uniformity (Kolmogorov-Smirnov; the gate fails p < {FALSE_ALARM_RATE:g} by default). Flat bars at the dashed "
               "line: the server samples right. Left-heavy: greedy or too cold. Right-heavy: too hot.", class_="muted")
    return el("section", el("h2", "Sampling"), intro, *blocks, id="sampling")
