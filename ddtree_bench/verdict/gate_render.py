"""What the gate writes: JUnit XML (one testcase per rule and per prompt), a markdown summary for
PR comments, and the terminal view. Everything is derived from a `GateResult`; nothing is judged here.

JUnit mapping: status fail -> <failure>, skip -> <skipped>, warn -> a passing case whose
<system-out> starts with "warning:". A prompt's case fails only when the rule that judges its kind
failed (so the XML and the exit code always agree); near ties pass and say so in <system-out>.
"""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from ddtree_bench.verdict.gate import GateResult

ICON = {"pass": "✅", "fail": "❌", "warn": "⚠️", "skip": "⏭️"}
MAX_MD_PROMPTS = 20


def _prompt_case_name(p) -> str:
    return _x(f"{p.prompt_id} turn {p.turn}")


def _prompt_note(p, g: GateResult | None = None) -> str:
    parts = [p.kind + (f" ({p.reason})" if p.reason and p.kind == "length_only" else "")]
    if p.first_divergence is not None:
        parts.append(f"first divergence at token {p.first_divergence}")
    if p.gap is not None:
        parts.append(f"baseline gap {p.gap:.3g}")
    if p.explanation:
        parts.append(p.explanation)
    if p.context:
        parts.append(f"context: {p.context}")
    rc = g.recheck_of(p) if g is not None and p.kind == "near_tie" else None
    if rc is not None:
        parts.append(f"re-check {rc.status}: {rc.note}")
    return "; ".join(parts)


def junit_xml(g: GateResult) -> str:
    root = ET.Element("testsuites", name="ddtree-bench gate")
    groups = [("correctness", [c for c in g.checks if c.group == "correctness"]),
              ("performance", [c for c in g.checks if c.group == "performance"])]
    total = fails = skips = 0
    for name, checks in groups:
        suite = ET.SubElement(root, "testsuite", name=f"ddtree-bench.{name}")
        f = s = 0
        for c in checks:
            case = ET.SubElement(suite, "testcase", classname=f"ddtree-bench.{name}", name=_x(c.name), time="0")
            msg = _x(c.message)
            if c.status == "fail":
                ET.SubElement(case, "failure", message=msg, type="regression").text = msg
                f += 1
            elif c.status == "skip":
                ET.SubElement(case, "skipped", message=msg)
                s += 1
            else:
                ET.SubElement(case, "system-out").text = ("warning: " if c.status == "warn" else "") + msg
        suite.set("tests", str(len(checks)))
        suite.set("failures", str(f))
        suite.set("skipped", str(s))
        total, fails, skips = total + len(checks), fails + f, skips + s
    suite = ET.SubElement(root, "testsuite", name="ddtree-bench.prompts")
    f = s = 0
    for p in g.comparison.prompts:
        case = ET.SubElement(suite, "testcase", classname="ddtree-bench.prompts", name=_prompt_case_name(p), time="0")
        rule = g.prompt_failure(p)
        if rule is not None:
            ET.SubElement(case, "failure", message=f"{p.kind} ({rule})", type=p.kind).text = _x(_prompt_note(p, g))
            f += 1
        elif p.kind in ("after_divergence", "sampled"):
            ET.SubElement(case, "skipped", message=_x(_prompt_note(p, g)))
            s += 1
        elif p.kind != "match":
            ET.SubElement(case, "system-out").text = _x(_prompt_note(p, g))
    suite.set("tests", str(len(g.comparison.prompts)))
    suite.set("failures", str(f))
    suite.set("skipped", str(s))
    root.set("tests", str(total + len(g.comparison.prompts)))
    root.set("failures", str(fails + f))
    root.set("skipped", str(skips + s))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


_MD_SPECIAL = re.compile(r"([\\`*_\[\]()|~#!{}])")  # (user text never starts a line, so - + . are inert)


def _md_escape(s: object) -> str:
    """Text from runs, suites and baselines as inert markdown for a PR comment: HTML escaped (so
    `<img onerror=...>` is shown, not rendered), markdown punctuation and `|` backslash-escaped (no
    links, code spans or broken tables), `@` defused (no pings), newlines and control characters
    as spaces."""
    s = "".join(ch if ch.isprintable() else " " for ch in str(s))
    s = _MD_SPECIAL.sub(r"\\\1", s)
    return html.escape(s, quote=False).replace("@", "&#64;")


_XML_BAD = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _x(s: object) -> str:
    """Text XML 1.0 can hold (control characters and lone surrogates would make the report unparsable)."""
    return _XML_BAD.sub("\ufffd", str(s))


def markdown(g: GateResult) -> str:
    c = g.comparison
    ri, bi = c.run_info, c.baseline_info
    verdict = "✅ passed" if g.passed else f"❌ failed ({len(g.failed)} of {len(g.checks)} checks)"
    budget = f" B={ri.get('budget')}" if ri.get("method") == "ddtree" else ""
    lines = [f"## ddtree-bench gate: {verdict}", "",
             f"Run {_md_escape(c.run)} ({_md_escape(ri.get('backend'))} {_md_escape(ri.get('method'))}{_md_escape(budget)}, "
             f"suite {_md_escape(ri.get('suite'))}, T={_md_escape(ri.get('temperature'))}, {_md_escape(ri.get('dtype'))}) "
             f"against baseline {_md_escape(c.baseline)} ({_md_escape(bi.get('source'))} {_md_escape(bi.get('method'))}, "
             f"{_md_escape(bi.get('model'))}, {_md_escape(bi.get('dtype'))}); near-tie gap {g.rules.near_tie_gap:g}.", ""]
    if c.token_comparable:
        lines.append(f"Exact match **{c.count('match')}/{len(c.prompts)}**, confident divergences **{c.count('divergence')}**, "
                     f"near ties {c.count('near_tie')}, unknown gap {c.count('unknown')}, length-only {c.count('length_only')}, "
                     f"errors {c.count('error')}.")
    else:
        lines.append(f"Tokens not compared: {c.not_comparable_reason}.")
    lines += ["", "| check | status | result |", "|---|---|---|"]
    for ch in g.checks:
        lines.append(f"| {ch.name} | {ICON[ch.status]} {ch.status} | {_md_escape(ch.message)} |")  # names are ours
    bad = [p for p in c.prompts if g.prompt_failure(p) is not None]
    if bad:
        lines += ["", f"### Failing prompts ({len(bad)})", "", "| prompt | turn | kind | at token | gap | context |", "|---|---|---|---|---|---|"]
        for p in bad[:MAX_MD_PROMPTS]:
            gap = f"{p.gap:.3g}" if p.gap is not None else "-"
            at = p.first_divergence if p.first_divergence is not None else "-"
            lines.append(f"| {_md_escape(p.prompt_id)} | {p.turn} | {p.kind} | {at} | {gap} | "
                         f"{_md_escape((p.context or p.explanation or '')[:120])} |")
        if len(bad) > MAX_MD_PROMPTS:
            lines.append(f"\n... and {len(bad) - MAX_MD_PROMPTS} more (see the JUnit report or `ddtree-bench compare --json`).")
    near = [p for p in c.prompts if p.kind == "near_tie"]
    if near:
        lines += ["", f"<details><summary>Near ties ({len(near)}): expected floating-point flips</summary>", ""]
        lines += [f"- {_md_escape(p.prompt_id)} turn {p.turn}: token {p.first_divergence}, gap {p.gap:.3g}"
                  + (f"; re-check {rc.status}" if (rc := g.recheck_of(p)) is not None else "") for p in near[:MAX_MD_PROMPTS]]
        lines += ["", "</details>"]
    if g.warnings:
        lines += ["", "**Warnings**", ""] + [f"- {_md_escape(w)}" for w in g.warnings]
    return "\n".join(lines) + "\n"


def text(g: GateResult) -> str:
    """Terminal view: one line per check, then the verdict."""
    w = max(len(c.name) for c in g.checks)
    lines = [f"{c.status.upper():4}  {c.name.ljust(w)}  {c.message}" for c in g.checks]
    lines += [f"warning: {x}" for x in g.warnings]
    unjudged = [c.name for c in g.checks if c.message.startswith("NOT JUDGED")]
    lines.append(("gate: PASSED" if g.passed else f"gate: FAILED ({', '.join(c.name for c in g.failed)})")
                 + (f" (NOT JUDGED: {', '.join(unjudged)})" if unjudged else ""))
    return "\n".join(lines)


def write_text(path: Path, content: str) -> None:
    """Write a report file via a unique temporary file and rename (missing directories are created)."""
    from ddtree_bench.outpaths import atomic_write_text, make_dirs

    path = Path(path)
    make_dirs(path.parent)
    atomic_write_text(path, content)
