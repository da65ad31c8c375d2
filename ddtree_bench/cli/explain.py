"""`ddtree-bench explain RUN`: why a server's DFlash/DDTree acceptance differs from z-lab's drafter.

Prints the verdict and writes explain.json (in the run directory, or --out). Exit 0 when the
instrument ran (whatever it found), 2 on bad input. See docs/explain.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ddtree_bench import defaults as D
from ddtree_bench.cli import options as O
from ddtree_bench.cli.app import app
from ddtree_bench.explain.analyse import EXPLAIN_CPU_THREADS


@app.command("explain", epilog="\b\nExamples:\n  ddtree-bench explain results/vllm-dflash --model toy")
def explain_cmd(
    run: Annotated[Path, typer.Argument(help="A run directory of a greedy dflash/ddtree run (run.json + records.jsonl).", show_default=False)],
    model: Annotated[Optional[str], typer.Option("--model", help="Target the reference engine loads (default: the run's --model).")] = None,
    draft: O.Draft = None,
    server_draft: Annotated[Optional[str], typer.Option("--server-draft", help="The drafter directory the server was launched with, when it may differ from --draft: its config is diffed against the reference's.")] = None,
    variants: Annotated[Optional[str], typer.Option("--variants", help="Comma-separated variants to try: drafter variants, and target variants (gdn-crop) on hybrid targets (default: the catalog; docs/explain.md lists the names).")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", help="Replay only the run's first N requests.")] = None,
    dtype: O.Dtype = D.DTYPE,
    device: O.Device = D.DEVICE,
    out: Annotated[Optional[Path], typer.Option("--out", help="JSON file to write (default: RUN/explain.json).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the JSON document instead of the text report.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    full_replay: Annotated[bool, typer.Option("--full-replay", help="Replay every drafter variant in full on the reference engine instead of scoring it against the one reference decode (slower; the same figures).")] = False,
    threads: Annotated[int, typer.Option("--threads", help="torch intra-op threads while the reference engine runs on a CPU.")] = EXPLAIN_CPU_THREADS,
    allow_model_mismatch: Annotated[bool, typer.Option("--allow-model-mismatch", help="Replay on a --model whose weights are not the run's (refused otherwise: exit 2; then a config finding says so).")] = False,
) -> None:
    """Explain an acceptance gap: replay the run on the reference engine under known drafter variants and name the one that reproduces the server."""
    import json

    from ddtree_bench.explain.analyse import explain, format_text
    from ddtree_bench.records import json_safe
    from ddtree_bench.outpaths import make_dirs
    from ddtree_bench.results import check_out_parent, write_json_atomic

    target = out if out is not None else Path(run) / "explain.json"
    if out is not None:
        check_out_parent(out)
    names = [v for v in (variants or "").split(",") if v.strip()] if variants is not None else None
    if names == []:
        from ddtree_bench.errors import UsageError

        raise UsageError(f"--variants {variants!r} names no variant", hint="leave it out to try the whole catalog (docs/explain.md), or name some, e.g. --variants causal")
    res = explain(run, model, draft, server_draft, names, limit, dtype, device, progress=not quiet,
                  full_replay=full_replay, threads=threads, allow_model_mismatch=allow_model_mismatch)
    make_dirs(target.parent)
    write_json_atomic(target, res)
    if json_out:
        typer.echo(json.dumps(json_safe(res), ensure_ascii=False, allow_nan=False))
    else:
        typer.echo(format_text(res))
        typer.echo(f"explain: {target}")
