"""`ddtree-bench sweep`: a grid of configurations -> results/<sweep-id>/ (+ an HTML report).

With no arguments it runs the embedded default: the in-process toy pair on the bundled gsm8k suite,
AR + DFlash + DDTree at budgets 16..1024 (`defaults.SWEEP_*`). Grid flags take comma lists and
override `--config grid.yaml`; `--resume [SWEEP_DIR]` continues a sweep (the latest one under
results/ when no directory is given) with the grid stored in its sweep.json.

Exit codes: 0 every point ran and no greedy output diverges confidently; 1 a point failed, or a
DFlash/DDTree point's greedy outputs confidently diverge from the sweep's AR point (or from
--baseline; sweep/correctness.py; near ties are shown, not failed); 2 bad input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ddtree_bench import defaults as D
from ddtree_bench.cli import options as O
from ddtree_bench.cli.app import app

_L = "Comma list."


def _opt(*names: str, help: str):
    return typer.Option(*names, help=help, show_default=False)


@app.command("sweep", epilog="\b\nExamples:\n  ddtree-bench sweep\n  ddtree-bench sweep --backends vllm --methods dflash --limit 8 --server-python ~/venvs/vllm/bin/python\n  ddtree-bench sweep --resume results/20261201-120000-sweep-inprocess")
def sweep_cmd(
    sweep_dir: Annotated[Optional[Path], typer.Argument(help="With --resume: the sweep directory to continue (default: the latest under results/).", show_default=False)] = None,
    config: Annotated[Optional[Path], _opt("--config", help="Grid YAML (keys as in docs/serving-ddtree.md; unknown keys are errors). Flags override it.")] = None,
    backends: Annotated[Optional[str], _opt("--backends", "--backend", help=f"inprocess | standalone | sglang | vllm | llamacpp | openai. {_L} [default: {D.BACKEND}]")] = None,
    models: Annotated[Optional[str], _opt("--models", "--model", help=f"'toy', 'toy-hybrid', 'random' or model directories / ids. {_L} [default: {D.MODEL}]")] = None,
    drafts: Annotated[Optional[str], _opt("--drafts", "--draft", help=f"DFlash drafters, one per model (or one for all). {_L}")] = None,
    methods: Annotated[Optional[str], _opt("--methods", "--method", help=f"ar, dflash, ddtree (AR is always added as the baseline). {_L} [default: {','.join(D.SWEEP_METHODS)}]")] = None,
    budgets: Annotated[Optional[str], _opt("--budgets", help=f"DDTree budgets: LO..HI = powers of two inclusive, or a comma list; at most {D.MAX_BUDGET}. [default: {D.SWEEP_BUDGETS}]")] = None,
    spec_tokens: Annotated[Optional[str], _opt("--spec-tokens", help=f"Drafted tokens per round = block size - 1 (sglang/vllm only; default: the drafter's / the profile's). {_L}")] = None,
    concurrency: Annotated[Optional[str], _opt("--concurrency", help=f"Closed-loop concurrency levels. {_L} [default: {D.CONCURRENCY}]")] = None,
    request_rates: Annotated[Optional[str], _opt("--request-rates", "--request-rate", help=f"Open-loop Poisson rates per second; 'closed' = the closed-loop points. {_L} [default: closed]")] = None,
    temperatures: Annotated[Optional[str], _opt("--temperatures", "--temperature", help=f"{_L} [default: {D.TEMPERATURE:g}]")] = None,
    suites: Annotated[Optional[str], _opt("--suites", "--suite", help=f"Suite names or JSONL files. {_L} [default: {D.SWEEP_SUITE}]")] = None,
    limit: Annotated[Optional[int], _opt("--limit", help=f"Prompts per point. [default: {D.SWEEP_LIMIT}]")] = None,
    max_new_tokens: Annotated[Optional[int], _opt("--max-new-tokens", help=f"Maximum generated tokens per turn. [default: {D.SWEEP_MAX_NEW_TOKENS}]")] = None,
    repeats: Annotated[Optional[int], _opt("--repeats", help=f"Repeat every client-side point N times (seed + repeat). [default: {D.SWEEP_REPEATS}]")] = None,
    order: Annotated[Optional[str], _opt("--order", help=f"With --repeats: interleaved (rounds of every point, shuffled per round; per server group for servers) | as-listed (repeats back to back) | rounds (also cycle server groups, restarting servers). [default: {D.SWEEP_ORDER}]")] = None,
    order_seed: Annotated[Optional[int], _opt("--order-seed", help="Seed of the per-round shuffles (recorded in sweep.json). [default: drawn]")] = None,
    dtype: Annotated[Optional[str], _opt("--dtype", help=f"float32 | bfloat16 | float16. {_L} [default: {D.DTYPE}; {D.EXTERNAL_DTYPE} for sglang/vllm]")] = None,
    device: Annotated[Optional[str], _opt("--device", help=f"cpu | cuda | cuda:N. {_L} [default: {D.DEVICE}; {D.EXTERNAL_DEVICE} for sglang/vllm]")] = None,
    cuda_graphs: Annotated[Optional[bool], typer.Option("--cuda-graphs/--no-cuda-graphs", help="In-process points: the fixed-shape CUDA-graph loop (GPU). [default: off]", show_default=False)] = None,
    seed: Annotated[Optional[int], _opt("--seed", help=f"Sampling seed. [default: {D.SEED}]")] = None,
    warmup: Annotated[Optional[int], _opt("--warmup", help=f"Warmup requests (per point in-process, per server start otherwise). [default: {D.WARMUP_REQUESTS}]")] = None,
    endpoint: Annotated[Optional[str], _opt("--endpoint", help="chat | completions (HTTP backends). [default: chat]")] = None,
    profiles: Annotated[Optional[Path], _opt("--profiles", help="Directory of <backend>.yaml profiles overriding the bundled ones.")] = None,
    server_python: Annotated[Optional[str], _opt("--server-python", help="Python of the environment that holds the serving engine (sglang/vllm), launched as PY -m <engine's server module>. [default: the first Python on PATH that can import it]")] = None,
    llama_server: Annotated[Optional[str], _opt("--llama-server", help="llama.cpp's llama-server binary (backend llamacpp). [default: the first llama-server on PATH, else the one scripts/install-llama-cpp.sh built]")] = None,
    workers: Annotated[Optional[int], _opt("--workers", help=f"Server groups run at once on this host, each in its own worker pinned to its own GPUs / CPU cores (allowed with --resume). [default: {D.SWEEP_WORKERS}]")] = None,
    gpus_per_point: Annotated[Optional[int], _opt("--gpus-per-point", help=f"GPUs each worker (or Ray task) gets: CUDA_VISIBLE_DEVICES / num_gpus. [default: {D.SWEEP_GPUS_PER_POINT}]")] = None,
    executor: Annotated[Optional[str], _opt("--executor", help=f"local (this host) | ray (one Ray task per server group; the [ray] extra: pip install -e \".[ray]\"). [default: {D.SWEEP_EXECUTOR}]")] = None,
    ray_address: Annotated[Optional[str], _opt("--ray-address", help="--executor ray: the cluster, HOST:PORT or ray://HOST:PORT. [default: RAY_ADDRESS, else a new local Ray]")] = None,
    ray_resources: Annotated[Optional[str], _opt("--ray-resources", help="--executor ray: custom resources every task asks for, as JSON, e.g. '{\"h200\": 1}'.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan (points, server groups, workers, estimated time) and exit.")] = False,
    api_key: O.ApiKey = None,
    out: Annotated[Optional[Path], _opt("--out", help="Sweep directory (default: results/<sweep-id>).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue a sweep: finished points are kept, failed and missing ones run.")] = False,
    baseline: Annotated[Optional[Path], _opt("--baseline", help="Also compare every point's greedy outputs with this baseline file (baseline record / import); every DFlash/DDTree point is always compared with the sweep's AR point. Kept by --resume.")] = None,
    allow_model_mismatch: Annotated[bool, typer.Option("--allow-model-mismatch", help="Compare with a --baseline recorded with another model (refused otherwise: exit 2).")] = False,
    report: Annotated[bool, typer.Option("--report/--no-report", help="Write the HTML report: beside the sweep directory (DIR.html) with --out DIR, else reports/<sweep-id>.html.")] = True,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")] = False,
) -> None:
    """Run a grid of configurations (servers or the in-process engine) into results/<sweep-id>/."""
    from ddtree_bench.errors import RunFailed, UsageError
    from ddtree_bench.sweep.grid import build_grid
    from ddtree_bench.sweep.run import latest_sweep, new_sweep_dir, run_sweep

    flags: dict[str, Any] = {
        "backends": backends, "models": models, "drafts": drafts, "methods": methods, "budgets": budgets,
        "spec_tokens": spec_tokens, "concurrency": concurrency, "request_rates": request_rates,
        "temperatures": temperatures, "suites": suites, "limit": limit, "max_new_tokens": max_new_tokens,
        "repeats": repeats, "order": order, "order_seed": order_seed, "dtype": dtype, "device": device, "cuda_graphs": cuda_graphs, "seed": seed, "warmup": warmup, "endpoint": endpoint,
        "profiles": str(profiles) if profiles else None, "server_python": server_python, "llama_server": llama_server,
    }
    execution = {"workers": workers, "gpus_per_point": gpus_per_point, "executor": executor,
                 "ray_address": ray_address, "ray_resources": ray_resources}  # where points run: allowed with --resume
    if not resume:
        flags.update(execution)
    if resume:
        given = [k for k, v in flags.items() if v is not None] + (["config"] if config else [])
        if given:
            raise UsageError(f"--resume takes the grid from the sweep's sweep.json; drop --{given[0].replace('_', '-')}")
        if sweep_dir and out and Path(sweep_dir) != Path(out):
            raise UsageError("give the sweep directory once (SWEEP_DIR or --out)")
        target = Path(sweep_dir or out) if (sweep_dir or out) else latest_sweep()
        grid = None
    else:
        if sweep_dir is not None:
            raise UsageError(f"unexpected argument {sweep_dir}", hint="to continue a sweep: ddtree-bench sweep --resume DIR")
        grid = build_grid(config, flags)
        target = Path(out) if out else new_sweep_dir(grid)
    if resume:
        grid = _stored_grid(target)
        from ddtree_bench.sweep.grid import PARSERS

        for k, v in execution.items():
            if v is not None:
                setattr(grid, k, PARSERS[k](v))
    if dry_run:
        from ddtree_bench.sweep.plan import dry_run as plan_dry_run

        if baseline is not None:   # what the sweep would refuse, the dry run refuses too
            from ddtree_bench.baselines.file import read_baseline
            from ddtree_bench.sweep.correctness import check_baseline_model

            check_baseline_model(read_baseline(baseline), grid.models, allow_model_mismatch)

        for line in plan_dry_run(grid, target if resume else None, api_key):
            typer.echo(line)
        return
    if resume:
        typer.echo(f"resuming {target}")
        outcome = run_sweep(grid, target, resume=True, api_key=api_key, progress=not quiet, echo=typer.echo,
                            baseline=baseline, allow_model_mismatch=allow_model_mismatch)
    else:
        outcome = run_sweep(grid, target, api_key=api_key, progress=not quiet, echo=typer.echo,
                            baseline=baseline, allow_model_mismatch=allow_model_mismatch)
    if outcome.auto_ar:
        typer.echo("note: the AR baseline was added to the grid (speedup_vs_ar needs it)")
    summary = _sweep_summary(outcome.out)
    typer.echo(final_table(summary["rows"] if summary else outcome.rows))
    typer.echo(f"results: {outcome.out}  (summary.csv, points/, sweep.json)")
    if report and outcome.rows:
        path = _report(outcome.out, report_path(outcome.out, out is not None or sweep_dir is not None))
        if path is not None:
            typer.echo(f"report: {path}")
    for t in (summary or {}).get("takeaways") or []:  # the closing line: a winner only when intervals separate
        typer.echo("takeaway" + (f" ({t['settings']})" if t.get("settings") else "") + ": " + t["sentence"])
    for t in (summary or {}).get("no_takeaway") or []:  # a load the backend did not honour: said, not silently skipped
        typer.echo("no takeaway" + (f" ({t['settings']})" if t.get("settings") else "") + ": " + t["why"])
    for line in outcome.correctness:  # is it correct: greedy outputs vs the sweep's AR point (and --baseline)
        typer.echo(line)
    if outcome.diverged:
        raise RunFailed(f"{len(outcome.diverged)} point(s) confidently diverge from greedy AR: "
                        + ", ".join(outcome.diverged[:3]) + (" ..." if len(outcome.diverged) > 3 else ""),
                        hint=f"see the correctness column of {outcome.out}/summary.csv and points/<id>/compare_ar.json")
    if outcome.failed:
        raise RunFailed(f"{len(outcome.failed)} of {len(outcome.points)} points failed (see status.json in {outcome.out}/points/)",
                        hint=f"rerun the failed points with: ddtree-bench sweep --resume {outcome.out}")


def _stored_grid(target: Path):
    from ddtree_bench.sweep.grid import GridSpec
    from ddtree_bench.sweep.layout import SweepDir

    return GridSpec.from_dict(SweepDir(target).read()["grid"])


def report_path(sweep_dir: Path, given: bool) -> Path:
    """Where the sweep's report goes: beside a directory the user named (--out DIR or --resume DIR:
    DIR.html), else reports/<sweep-id>.html for the default results/<sweep-id>/."""
    sweep_dir = Path(sweep_dir)
    if given and sweep_dir.resolve().parent != Path("results").resolve():
        return sweep_dir.parent / f"{sweep_dir.name}.html"
    return Path("reports") / f"{sweep_dir.name}.html"


def _report(sweep_dir: Path, path: Path) -> Path | None:
    """The sweep's HTML report at `path` via the report renderer; None (table only) while it is not installed."""
    try:
        from ddtree_bench.report import write_report  # INTEGRATION(report): issue of the HTML report
    except ImportError:
        return None
    try:
        return write_report([sweep_dir], path)
    except Exception as e:  # a report problem must not hide the sweep's results
        typer.echo(f"warning: the HTML report failed ({type(e).__name__}: {e})", err=True)
        return None


def _sweep_summary(sweep_dir: Path) -> dict[str, Any] | None:
    from ddtree_bench.sweep.aggregate import read_summary

    return read_summary(sweep_dir)


def final_table(rows: list[dict[str, Any]]) -> str:
    """budget, tau, tok/s, speedup vs AR (with intervals), TTFT/TPOT p50 per point (`display.sweep_table`)."""
    from ddtree_bench.display import sweep_table

    return sweep_table(rows)
