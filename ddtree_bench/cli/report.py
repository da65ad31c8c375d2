"""`ddtree-bench report`: run / sweep directories -> one self-contained offline HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ddtree_bench.cli.app import app


@app.command("report", epilog="\b\nExamples:\n  ddtree-bench report results/20261201-120000-sweep-inprocess --out report.html")
def report_cmd(
    results: Annotated[list[Path], typer.Argument(help="Run directories (run.json + records.jsonl) and/or sweep directories (sweep.json).", show_default=False, metavar="RESULTS_DIR")],
    out: Annotated[Path, typer.Option("--out", help="The HTML file to write (written atomically).", show_default=False, metavar="FILE.html")],
    compare: Annotated[Optional[list[Path]], typer.Option("--compare", metavar="FILE.json", help="`ddtree-bench compare --json` output to show in the correctness section (repeatable). A compare.json inside a run directory is picked up by itself.")] = None,
    title: Annotated[Optional[str], typer.Option("--title", metavar="TEXT", help="Page title (default: from the inputs).")] = None,
) -> None:
    """Write an offline HTML report: metadata, headline table, plots (τ, tok/s, speedup vs budget; acceptance histograms; latency vs load; stage split) and correctness."""
    from ddtree_bench.report import write_report
    from ddtree_bench.report.data import load_compare

    from ddtree_bench.outpaths import check_output_file

    check_output_file(out, "--out")
    docs = [load_compare(p) for p in compare or []]
    path = write_report(list(results), out, docs, title=title, warn=lambda m: typer.echo(f"warning: {m}", err=True))
    typer.echo(f"report: {path}")
