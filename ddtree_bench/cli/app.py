"""The typer application object and the sub-command groups, shared by every command module.

Keep imports here to a minimum: `ddtree-bench --help` must not import torch, aiohttp or pandas.
Command modules in this package decorate `app` (or a group) and import heavy code inside the
command body.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="ddtree-bench",
    help="Is your DDTree speculative-decoding deployment correct, and how fast is it?",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    epilog="\b\nExamples:\n  ddtree-bench sweep                      # the main job on the bundled toy pair\n"
           "  ddtree-bench run --backend sglang --url http://127.0.0.1:30000 --model /models/Qwen3.6-27B --out results/prod\n"
           "  ddtree-bench gate results/prod --baseline baselines/q36.jsonl\n"
           "  ddtree-bench COMMAND --help            # each command's own examples",
)
baseline_app = typer.Typer(help="Record or import greedy baselines.", no_args_is_help=True,
                           epilog="\b\nExamples:\n  ddtree-bench baseline record --suite gsm8k --limit 32 --out baselines/toy-gsm8k.jsonl\n"
                                  "  ddtree-bench baseline import authors_output.pt --trust-pickle --tokenizer /models/Qwen3-8B --suite gsm8k --out baselines/zlab.jsonl")
toy_app = typer.Typer(help="The bundled toy target + DFlash drafter pair.", no_args_is_help=True,
                      epilog="\b\nExamples:\n  ddtree-bench toy train --out /tmp/toy --device cuda\n"
                             "  ddtree-bench toy train --hybrid --out /tmp/toy-hybrid --device cuda --time-budget-s 420")
app.add_typer(baseline_app, name="baseline")
app.add_typer(toy_app, name="toy")

state = {"debug": False}


def _version(value: bool) -> None:
    if value:
        from ddtree_bench import __version__

        typer.echo(f"ddtree-bench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks instead of one-line errors (accepted anywhere on the line)."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    state["debug"] = state["debug"] or debug  # cli.main takes --debug out of the line wherever it is
    _check_engine_environment()


def _check_engine_environment() -> None:
    """The GPU path's environment knobs, read deep inside a forward, checked before any work: an unknown
    DDTREE_GPU_EXPERIMENTAL feature, an A/B knob that is not a positive integer or an unreadable DDTREE_GEMM_TABLE
    is exit 2 here, not a failed request."""
    import os

    from ddtree_bench.engine.gpu.kernels import experimental

    experimental.requested()
    experimental.check_knobs()
    if os.environ.get("DDTREE_GEMM_TABLE"):
        from ddtree_bench.engine.gpu.kernels import gemm

        gemm._env_table()
