"""The report's "Sampling" section: for T > 0 runs, the histogram of the randomised PIT u that
`compare` tested (`distribution` in `compare --json`; verdict/distribution.py), one per compare result.

u is uniform on [0, 1] exactly when the server samples from the target's tempered distribution, so
the bars should be flat around the dashed line (n / bins); greedy or too-cold sampling piles them
on the left, too-hot sampling on the right. Drawn as inline SVG (no script, no external resource).
Knows the `distribution` section's keys and the report's markup helpers; nothing of engines.
"""

from __future__ import annotations

from typing import Any

from ddtree_bench.report.markup import Html, el
from ddtree_bench.verdict.distribution import FALSE_ALARM_RATE

WIDTH, HEIGHT, PAD = 400, 120, 4


def u_histogram_svg(counts: list[int]) -> Html:
    """Bars of `counts` over [0, 1] with a dashed line at the uniform expectation."""
    n, bins = sum(counts), len(counts)
    expect = n / bins if bins else 0.0
    top = max([*counts, expect, 1.0]) * 1.1
    w = (WIDTH - 2 * PAD) / max(bins, 1)
    y = lambda c: HEIGHT - PAD - (HEIGHT - 2 * PAD) * c / top  # noqa: E731
    bars = [el("rect", el("title", f"u in [{i / bins:.2f}, {(i + 1) / bins:.2f}): {c}"), x=f"{PAD + i * w + 1:.1f}",
               y=f"{y(c):.1f}", width=f"{max(w - 2, 1):.1f}", height=f"{HEIGHT - PAD - y(c):.1f}", fill="#4a7bb7")
            for i, c in enumerate(counts)]
    line = el("line", x1=str(PAD), x2=str(WIDTH - PAD), y1=f"{y(expect):.1f}", y2=f"{y(expect):.1f}", stroke="#333",
              stroke_dasharray="4 3")
    return el("svg", *bars, line, viewBox=f"0 0 {WIDTH} {HEIGHT}", width=str(WIDTH), height=str(HEIGHT), role="img",
              aria_label=f"histogram of u over {n} tokens in {bins} bins; uniform expectation {expect:.1f} per bin")


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
    return el("div", el("h3", el("code", label), f" \u2014 {head}"), el("p", text), u_histogram_svg(list(d.get("histogram") or [])),
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
