"""The front page (README.md) stays a front page: at most FRONT_PAGE_MAX_LINES lines, and every relative link on it
(and on docs/*.md) names a file of the repository. Issues show their figures on a page under docs/ with a line and a
link here (the newcomer issue's rule); a renamed doc would otherwise leave a dead link that no other test reads.
Knows nothing of what the pages say.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FRONT_PAGE_MAX_LINES = 250
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def dead_links(page: Path) -> list[str]:
    """Relative link targets on `page` that name no file or folder (web links and anchors are not checked)."""
    text = page.read_text(encoding="utf-8")
    return [t for t in LINK.findall(text)
            if not re.match(r"[a-z]+:", t) and not (page.parent / t).exists()]


def test_the_front_page_stays_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= FRONT_PAGE_MAX_LINES, f"README.md has {lines} lines; move detail to docs/ and link it"


def test_every_relative_link_on_the_front_page_and_in_docs_resolves():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    dead = [f"{p.relative_to(ROOT)} -> {t}" for p in pages for t in dead_links(p)]
    assert not dead, "dead links:\n" + "\n".join(dead)


def test_the_link_check_sees_a_dead_link(tmp_path):
    page = tmp_path / "p.md"
    (tmp_path / "there.md").write_text("x")
    page.write_text("[a](there.md) [b](gone.md) [c](https://example.org/x) [d](there.md#part) [e](#anchor)")
    assert dead_links(page) == ["gone.md"]
