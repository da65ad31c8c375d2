"""The report's markup helpers, shared by every section (report/html.py, report/explain_section.py):
`Html` (a fragment already safe to emit), `esc`, `join`, `el` (an element whose children and
attribute values are escaped unless already `Html`), `Ids` (unique element ids of [A-Za-z0-9_-] only)
and `fmt` (a number as the report shows it, an em dash for None).

Knows HTML escaping; nothing of the report's data, sections or page.
"""

from __future__ import annotations

import html as _html
import re
from typing import Any, Iterable


class Html(str):
    """A fragment of markup that is already safe to emit."""


def esc(x: Any) -> Html:
    if isinstance(x, Html):
        return x
    return Html(_html.escape("" if x is None else str(x), quote=True))


def join(parts: Iterable[Any], sep: str = "") -> Html:
    return Html(esc(sep).join(esc(p) for p in parts))


def el(tag: str, *children: Any, **attrs: Any) -> Html:
    """<tag attrs>children</tag>; attribute names: trailing '_' dropped, '_' -> '-'; None skips, True is bare."""
    parts = [tag]
    for k, v in attrs.items():
        if v is None or v is False:
            continue
        name = k.rstrip("_").replace("_", "-")
        parts.append(name if v is True else f'{name}="{esc(v)}"')
    return Html(f"<{' '.join(parts)}>{join(children)}</{tag}>")


class Ids:
    """Unique, sanitised element ids: only [A-Za-z0-9_-], starting with a letter."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def make(self, prefix: str, text: Any) -> str:
        base = re.sub(r"[^A-Za-z0-9_-]+", "-", str(text)).strip("-")[:60] or "x"
        cand = f"{prefix}-{base}"
        n = 2
        while cand in self.used:
            cand = f"{prefix}-{base}-{n}"
            n += 1
        self.used.add(cand)
        return cand


def fmt(v: Any, digits: int = 2, suffix: str = "") -> str:
    if v is None:
        return "\u2014"
    if isinstance(v, float):
        return f"{v:,.{digits}f}{suffix}"
    return f"{v}{suffix}"
