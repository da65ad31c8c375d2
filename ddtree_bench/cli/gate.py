"""`ddtree-bench gate RESULTS --baseline FILE [--rules YAML] [--reference-run DIR ...] [--junit F] [--markdown F]`.

Exit 0 when every rule passes, 1 on a regression (RunFailed), 2 on bad input. The JUnit and
markdown files are written in every case where the gate ran, pass or fail.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, List, Optional

import typer

from ddtree_bench.cli.app import app
from ddtree_bench.cli.compare import AllowModelMismatch, BaselineOpt, NearTieGap, check_same_model


def _check_report_path(path: Optional[Path], flag: str) -> None:
    """Before anything is read: a file path whose directory can be created and written (exit 2)."""
    from ddtree_bench.outpaths import check_output_file

    if path is not None:
        check_output_file(path, flag)


@app.command("gate", epilog="\b\nExamples:\n  ddtree-bench gate results/prod-gsm8k --baseline baselines/toy-gsm8k.jsonl --junit gate.xml --markdown gate.md")
def gate_cmd(
    results: Annotated[Path, typer.Argument(help="A run directory (run.json + records.jsonl).", show_default=False)],
    baseline: BaselineOpt,
    rules: Annotated[Optional[Path], typer.Option("--rules", help="Rules YAML merged over the defaults (ddtree_bench/verdict/gate_rules.yaml).")] = None,
    reference_run: Annotated[Optional[List[Path]], typer.Option("--reference-run", help="A finished run to compare tok/s and latency with; repeat for noise-aware tolerances.")] = None,
    junit: Annotated[Optional[Path], typer.Option("--junit", help="Write JUnit XML here (one testcase per rule and per prompt).")] = None,
    markdown: Annotated[Optional[Path], typer.Option("--markdown", help="Write a markdown summary here (for a PR comment).")] = None,
    near_tie_gap: NearTieGap = None,
    allow_model_mismatch: AllowModelMismatch = False,
) -> None:
    """Judge a run: hard fail on confident greedy divergences and errors, soft noise-aware fail on tau and tok/s."""
    from ddtree_bench.errors import RunFailed
    from ddtree_bench.verdict import gate_render
    from ddtree_bench.verdict.gate import run_gate

    _check_report_path(junit, "--junit")
    _check_report_path(markdown, "--markdown")
    from ddtree_bench.baselines.file import read_baseline

    check_same_model(results, read_baseline(baseline), allow_model_mismatch)  # another model: exit 2
    g = run_gate(results, baseline, rules, reference_run or [], near_tie_gap)
    if junit is not None:
        gate_render.write_text(junit, gate_render.junit_xml(g))
    if markdown is not None:
        gate_render.write_text(markdown, gate_render.markdown(g))
    typer.echo(gate_render.text(g))
    if not g.passed:
        raise RunFailed(f"gate failed: {', '.join(c.name for c in g.failed)}",
                        hint=f"see `ddtree-bench compare {results} --baseline {baseline}` for the per-prompt diff")
