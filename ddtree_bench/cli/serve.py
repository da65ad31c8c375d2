"""`ddtree-bench serve`: the OpenAI-compatible server on the reference engine (or the null engine).

Refuses (exit 2, before loading anything) a non-loopback `--host` without `--api-key` unless
`--insecure` is given: loopback is 127.0.0.0/8, ::1 (also as ::ffff:127.x.y.z) and a name that
resolves only to those (`localhost`).
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ddtree_bench import defaults as D
from ddtree_bench.cli import options as O
from ddtree_bench.cli.app import app


@app.command("serve", epilog="\b\nExamples:\n  ddtree-bench serve --model toy --method ddtree --budget 64 --port 8000\n  ddtree-bench serve --null --port 8000")
def serve_cmd(
    model: O.Model = D.MODEL,
    draft: O.Draft = None,
    method: Annotated[str, typer.Option("--method", help="ar | dflash | ddtree | null (the null engine: instant tokens, no model).")] = D.METHOD,
    budget: O.Budget = D.BUDGET,
    dtype: O.Dtype = D.DTYPE,
    device: O.Device = D.DEVICE,
    cuda_graphs: O.CudaGraphs = False,
    host: Annotated[str, typer.Option("--host", help="Address to bind (loopback by default; another address needs --api-key or --insecure).")] = D.HOST,
    port: Annotated[int, typer.Option("--port", help="Port to bind (0 = any free port; the ready line says which).")] = D.PORT,
    api_key: O.ApiKey = None,
    max_queue: Annotated[int, typer.Option("--max-queue", help="Requests that may wait for the engine; more get 503.")] = D.SERVE_MAX_QUEUE,
    max_batch: Annotated[int, typer.Option("--max-batch", help="Requests the engine runs at once, batched (continuous batching; 1 = batch-1 engine).")] = D.SERVE_MAX_BATCH,
    null: Annotated[bool, typer.Option("--null", help="Same as --method null.")] = False,
    null_chunk_tokens: Annotated[int, typer.Option("--null-chunk-tokens", help="Null engine: tokens per streamed chunk.")] = D.NULL_CHUNK_TOKENS,
    null_delay_ms: Annotated[float, typer.Option("--null-delay-ms", help="Null engine: pause before each chunk after the first (0 = instant).")] = 0.0,
    served_model_name: Annotated[Optional[str], typer.Option("--served-model-name", help="Model id in /v1/models (default: the --model value, or 'null').")] = None,
    shutdown_grace: Annotated[float, typer.Option("--shutdown-grace", help="Seconds in-flight requests get to finish after SIGTERM.")] = D.SERVE_SHUTDOWN_GRACE_S,
    read_timeout: Annotated[float, typer.Option("--read-timeout", help="Seconds a request head or body may take to arrive (slow connections are dropped), a stalled stream write may wait, a keep-alive connection may idle.")] = D.SERVE_READ_TIMEOUT_S,
    insecure: Annotated[bool, typer.Option("--insecure", help="Allow a non-loopback --host without --api-key (anyone who can reach the port can use the model).")] = False,
    target_variant: Annotated[Optional[str], typer.Option("--target-variant", help="FAULT INJECTION for testing the tool: serve the target under a known deviation (gdn-crop: GDN state not rolled back, as transformers' Cache.crop; docs/hybrid-targets.md). Not lossless.")] = None,
) -> None:
    """Serve /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics until SIGTERM."""
    import asyncio
    import math
    import sys

    from ddtree_bench.errors import UsageError

    if null:
        method = "null"
    if method not in D.METHODS + ("null",):
        raise UsageError(f"unknown --method {method!r}; expected one of {', '.join(D.METHODS)} or null")
    if budget < 0:
        raise UsageError(f"--budget must be an integer >= 0, got {budget}")
    if method == "ddtree" and budget < 1:   # the rule run_spec.RunSpec.validate applies to `run`
        raise UsageError(f"--budget must be >= 1 for --method ddtree, got {budget}",
                         hint="a tree of no nodes drafts nothing: use --method ar")
    if max_queue < 0:
        raise UsageError(f"--max-queue must be >= 0, got {max_queue}")
    if max_batch < 1:
        raise UsageError(f"--max-batch must be an integer >= 1, got {max_batch}")
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be in 0..65535, got {port}")
    if not 0 <= shutdown_grace < math.inf:
        raise UsageError(f"--shutdown-grace must be a finite number >= 0, got {shutdown_grace}")
    if null_chunk_tokens < 1:
        raise UsageError(f"--null-chunk-tokens must be >= 1, got {null_chunk_tokens}")
    if not 0 <= null_delay_ms < math.inf:
        raise UsageError(f"--null-delay-ms must be a finite number >= 0, got {null_delay_ms}")
    if not 0 < read_timeout < math.inf:
        raise UsageError(f"--read-timeout must be a finite number > 0, got {read_timeout}")
    if not api_key and not is_loopback(host):
        if not insecure:
            raise UsageError(f"--host {host} is not a loopback address and there is no --api-key: anyone who can "
                             "reach the port could use the model",
                             hint="give --api-key KEY (or env DDTREE_BENCH_API_KEY), or --insecure to serve openly")
        print(f"warning: serving on {host} without --api-key (--insecure): anyone who can reach this port can use "
              "the model", file=sys.stderr, flush=True)

    from ddtree_bench.backends.serve_engine import EngineSource, NullSource
    from ddtree_bench.backends.standalone import READY_PREFIX, serve

    if method == "null":
        source = NullSource(served_model_name or "null", null_chunk_tokens, null_delay_ms / 1000)
        what = f"null engine, {null_chunk_tokens} tokens per chunk"
    else:
        from ddtree_bench.pair import load_pair

        print(f"ddtree-bench serve: loading {model} ({method}, {dtype}, {device})", file=sys.stderr, flush=True)
        pair = load_pair(model, draft, method, dtype, device, cuda_graphs=cuda_graphs)
        if target_variant is not None:
            from ddtree_bench.engine.target_variants import apply_to_pair

            apply_to_pair(pair, target_variant)
        source = EngineSource(pair, method, budget, served_model_name or model, max_batch=max_batch)
        what = (f"model {source.model_id}, method {method}" + (f", budget {budget}" if method == "ddtree" else "")
                + (f", batching up to {max_batch}" if max_batch > 1 else ""))

    def ready(url: str) -> None:
        print(f"{READY_PREFIX}{url} ({what})", flush=True)

    asyncio.run(serve(source, host=host, port=port, api_key=api_key, max_queue=max_queue, grace_s=shutdown_grace,
                      read_timeout_s=read_timeout, on_ready=ready))


def is_loopback(host: str) -> bool:
    """True when every address `host` names is a loopback address (a name that does not resolve is not)."""
    import ipaddress
    import socket

    def loop(addr: str) -> bool:
        ip = ipaddress.ip_address(addr.split("%", 1)[0])
        mapped = getattr(ip, "ipv4_mapped", None)
        return (mapped or ip).is_loopback

    try:
        return loop(host.strip("[]"))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(loop(info[4][0]) for info in infos)
