"""The offline HTML report: one self-contained page per run, set of runs or sweep.

    from ddtree_bench.report import write_report
    write_report([Path("results/sweep-1")], Path("reports/sweep-1.html"))

`write_report` loads the inputs (`data`), draws the figures whose data exists (`plots`), renders
the page (`html`) and writes it atomically (temporary file + rename; nothing is written when the
input is bad — `UsageError`, exit 2 on the command line). `compare` takes already-parsed
`ddtree-bench compare --json` documents; a `compare.json` inside a run or point directory is picked
up by itself.

This package reads results files only; it runs nothing and fetches nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from ddtree_bench.errors import UsageError


def render_report(paths: list[Path], compare: list[dict[str, Any]] | None = None, *, title: str | None = None,
                  warn: Callable[[str], None] | None = None) -> str:
    """The report page as a string (no file written). `warn` hears what the page warns of in its inputs
    (a compare result of a run the report does not hold)."""
    from ddtree_bench.report import data as _data
    from ddtree_bench.report import html as _html
    from ddtree_bench.report import plots as _plots

    loaded = _data.load([Path(p) for p in paths], compare)
    for c in loaded.compares:
        if c.foreign and warn is not None:
            warn(f"{c.source}: {c.foreign}")
    return _html.render(loaded, _plots.make_figures(loaded), title)


def write_report(paths: list[Path], out: Path, compare: list[dict[str, Any]] | None = None, *,
                 title: str | None = None, warn: Callable[[str], None] | None = None) -> Path:
    """Render the report of `paths` (run and/or sweep directories) into `out`, atomically. Returns `out`."""
    out = Path(out)
    if out.exists() and out.is_dir():
        raise UsageError(f"--out {out} is a directory; give a file name such as report.html")
    page = render_report(paths, compare, title=title, warn=warn)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as e:
        if "tmp" in locals() and tmp.exists():
            tmp.unlink()
        raise UsageError(f"cannot write {out}: {e.strerror or e}") from None
    return out


__all__ = ["render_report", "write_report"]
