"""`ddtree-bench compare RESULTS --baseline FILE [--json]`: per-prompt greedy diff with near-tie triage.

compare reports and gate judges: exit 0 whatever the diff finds, 2 on bad input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ddtree_bench import defaults as D
from ddtree_bench.cli.app import app

BaselineOpt = Annotated[Path, typer.Option("--baseline", help="Baseline file (baseline record / baseline import).")]
NearTieGap = Annotated[Optional[float], typer.Option("--near-tie-gap", help=f"Logit gap below which a divergence is a near tie (default {D.NEAR_TIE_GAP:g}; {D.SERVER_NEAR_TIE_GAP:g} for baselines recorded from a server; see docs/ci-gate.md, docs/explain.md).")]


@app.command("compare", epilog="\b\nExamples:\n  ddtree-bench compare results/prod-gsm8k --baseline baselines/toy-gsm8k.jsonl --json")
def compare_cmd(
    results: Annotated[Path, typer.Argument(help="A run directory (run.json + records.jsonl).", show_default=False)],
    baseline: BaselineOpt,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document instead of the table.")] = False,
    near_tie_gap: NearTieGap = None,
) -> None:
    """Diff a run's greedy outputs against a baseline, prompt by prompt."""
    import json

    from ddtree_bench.baselines.file import read_baseline
    from ddtree_bench.records import json_safe
    from ddtree_bench.verdict.compare import compare_run

    c = compare_run(results, read_baseline(baseline), near_tie_gap)  # None: the baseline's default (server baselines: SERVER_NEAR_TIE_GAP)
    if json_out:
        typer.echo(json.dumps(json_safe(c.to_json()), ensure_ascii=False, allow_nan=False))
    else:
        from ddtree_bench.verdict.compare_render import render

        typer.echo(render(c))
