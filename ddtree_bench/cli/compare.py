"""`ddtree-bench compare RESULTS --baseline FILE [--json]`: per-prompt greedy diff with near-tie triage.

compare reports and gate judges: exit 0 whatever the diff finds, 2 on bad input — a baseline
recorded with another target model (both model hashes known and different) is bad input unless
--allow-model-mismatch (then the diff runs and carries a warning).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ddtree_bench import defaults as D
from ddtree_bench.cli.app import app

BaselineOpt = Annotated[Path, typer.Option("--baseline", help="Baseline file (baseline record / baseline import).")]
AllowModelMismatch = Annotated[bool, typer.Option("--allow-model-mismatch", help="Judge a run against a baseline recorded with another target model (refused otherwise: exit 2).")]
NearTieGap = Annotated[Optional[float], typer.Option("--near-tie-gap", help=f"Logit gap below which a divergence is a near tie (default {D.NEAR_TIE_GAP:g}; {D.SERVER_NEAR_TIE_GAP:g} for baselines recorded from a server; see docs/ci-gate.md, docs/explain.md).")]


@app.command("compare", epilog="\b\nExamples:\n  ddtree-bench compare results/prod-gsm8k --baseline baselines/toy-gsm8k.jsonl --json")
def compare_cmd(
    results: Annotated[Path, typer.Argument(help="A run directory (run.json + records.jsonl).", show_default=False)],
    baseline: BaselineOpt,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON document instead of the table.")] = False,
    near_tie_gap: NearTieGap = None,
    allow_model_mismatch: AllowModelMismatch = False,
) -> None:
    """Diff a run's greedy outputs against a baseline, prompt by prompt."""
    import json

    from ddtree_bench.baselines.file import read_baseline
    from ddtree_bench.records import json_safe
    from ddtree_bench.verdict.compare import compare_run

    base = read_baseline(baseline)
    check_same_model(results, base, allow_model_mismatch)
    c = compare_run(results, base, near_tie_gap)  # None: the baseline's default (server baselines: SERVER_NEAR_TIE_GAP)
    if json_out:
        typer.echo(json.dumps(json_safe(c.to_json()), ensure_ascii=False, allow_nan=False))
    else:
        from ddtree_bench.verdict.compare_render import render

        typer.echo(render(c))


def check_same_model(results: Path, baseline, allow: bool) -> None:
    """Exit 2 (UsageError with a hint) when the run's target is not the baseline's, unless `allow`."""
    from ddtree_bench.errors import UsageError
    from ddtree_bench.results import is_run_dir, read_run_info
    from ddtree_bench.verdict.compare import model_mismatch

    if allow or not is_run_dir(Path(results)):  # not a run directory: compare_run says so
        return
    why = model_mismatch(read_run_info(results), baseline.header)
    if why:
        raise UsageError(f"{why}: its divergences would come from the model, not from a bug",
                         hint="record a baseline with the run's --model, or pass --allow-model-mismatch to compare anyway")
