"""`ddtree-bench run`: one configuration over one suite -> a results directory."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ddtree_bench import defaults as D
from ddtree_bench.cli import options as O
from ddtree_bench.cli.app import app


@app.command("run", epilog="\b\nExamples:\n  ddtree-bench run --model toy --method ddtree --budget 32 --suite gsm8k --limit 8\n  ddtree-bench run --backend vllm --url http://127.0.0.1:8000 --model toy --method dflash --out results/vllm-dflash")
def run_cmd(
    ctx: typer.Context,
    backend: O.Backend = D.BACKEND,
    url: O.Url = None,
    api_key: O.ApiKey = None,
    timeout: O.Timeout = D.REQUEST_TIMEOUT_S,
    model: O.Model = D.MODEL,
    draft: O.Draft = None,
    method: O.Method = D.METHOD,
    budget: O.Budget = D.BUDGET,
    suite: O.Suite = D.SUITE,
    limit: O.Limit = None,
    subset: O.Subset = None,
    max_new_tokens: O.MaxNewTokens = D.MAX_NEW_TOKENS,
    temperature: O.Temperature = D.TEMPERATURE,
    seed: O.Seed = D.SEED,
    dtype: O.Dtype = D.DTYPE,
    device: O.Device = D.DEVICE,
    cuda_graphs: O.CudaGraphs = False,
    concurrency: O.Concurrency = D.CONCURRENCY,
    request_rate: O.RequestRate = None,
    warmup: Annotated[int, typer.Option("--warmup", help="Warmup requests before measuring (not recorded).")] = D.WARMUP_REQUESTS,
    endpoint: Annotated[str, typer.Option("--endpoint", help="chat | completions (HTTP backends).")] = "chat",
    stream: O.Stream = True,
    llama_server: Annotated[str, typer.Option("--llama-server", help="--backend llamacpp without --url: the llama-server binary to start for this run. [default: the first on PATH, else scripts/install-llama-cpp.sh's]")] = "",
    out: O.Out = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the run already in --out (refused otherwise).")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or table.")] = False,
    target_variant: Annotated[Optional[str], typer.Option("--target-variant", help="FAULT INJECTION for testing the tool: run the in-process target under a known deviation (gdn-crop: GDN state not rolled back, as transformers' Cache.crop; docs/hybrid-targets.md). Not lossless.")] = None,
) -> None:
    """Run one configuration over one suite and write run.json, records.jsonl and summary.json."""
    from ddtree_bench.run_spec import RunSpec
    from ddtree_bench.display import run_summary
    from ddtree_bench.runner import execute

    launched = backend == "llamacpp" and url is None
    if launched:  # no server given: convert to GGUF and start one for this run
        import contextlib

        from ddtree_bench.backends.llamacpp_launch import launched_server

        stack = contextlib.ExitStack()
        ctx.call_on_close(stack.close)  # stopped when the command ends, whatever way
        server = stack.enter_context(launched_server(model, draft, method, dtype, device, llama_server or None, concurrency))
        url = server.url
        if not quiet:
            typer.echo(f"started {server.command} (log: {server.log})", err=True)
    spec = RunSpec(
        backend=backend, url=url, api_key=api_key, model=model, draft=draft, method=method, budget=budget,
        suite=suite, limit=limit, subset=subset, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, dtype=dtype,
        device=device, cuda_graphs=cuda_graphs, concurrency=concurrency, request_rate=request_rate, warmup=warmup, endpoint=endpoint,
        timeout_s=timeout, stream=stream,
    ).validate()
    if target_variant is not None:
        from ddtree_bench.engine.target_variants import parse_target_variant
        from ddtree_bench.errors import UsageError

        parse_target_variant(target_variant)
        if backend != "inprocess":
            raise UsageError("--target-variant changes the in-process engine; it does not apply to --backend " + backend)
        if method == "ar" and target_variant not in ("", "reference"):
            raise UsageError(f"--target-variant {target_variant} changes how a verify's rejected tree nodes are rolled "
                             "back; --method ar verifies no tree, so it would change nothing", hint="use --method dflash or ddtree")
        spec.extra["target_variant"] = target_variant
    if backend != "inprocess" and not launched:  # a server's own /server_info labels the run (backends/client.py)
        from ddtree_bench.backends.client import adopt_server_labels

        # by name: typer may vendor its own click, whose ParameterSource is not click's
        given = [n for n in ("method", "budget")
                 if getattr(ctx.get_parameter_source(n), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")]
        adopt_server_labels(spec, given)
    from ddtree_bench.results import check_run_out

    if out is not None:
        check_run_out(out, overwrite)  # before the model loads (execute checks again)
    result = execute(spec, out, progress=not quiet, overwrite=overwrite)
    if not quiet and result.summary is not None:
        typer.echo(run_summary(result.summary))
    typer.echo(f"results: {result.out}")
    failed = [r for r in result.records if not r.ok]
    if failed and result.summary is not None:  # every request failed is exit 1 (runner); some failed is said, even -q
        typer.echo(f"warning: {len(failed)} of {len(result.records)} requests failed; the metrics cover the "
                   f"{len(result.records) - len(failed)} that succeeded (first error: {failed[0].prompt_id} turn "
                   f"{failed[0].turn}: {' '.join(str(failed[0].error).split())[:300]})", err=True)
