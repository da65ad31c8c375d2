"""`ddtree-bench bench-engine`: where the reference engine's round time goes, and the best budget.

Measures the verify-forward cost curve, per-round stage times of AR / DFlash / DDTree per budget,
tree-build times, and (for trained pairs) end-to-end tok/s; prints tables with the cost model's
predictions next to the measurements; writes everything as one JSON document (--out FILE.json, and
as the last line of stdout). Work happens in ddtree_bench.perf.bench.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ddtree_bench import defaults as D
from ddtree_bench.cli import options as O
from ddtree_bench.cli.app import app


@app.command("bench-engine", epilog="\b\nExamples:\n  ddtree-bench bench-engine --model toy --budgets 16,64 --rounds 5 --prefix-len 256 --verify-tokens 1,16,64 --no-e2e --no-build-table   # seconds on a CPU\n  ddtree-bench bench-engine --shape qwen3-8b --device cuda --dtype bfloat16 --budgets 16..1024 --no-plain\n  ddtree-bench bench-engine --shape qwen3-8b --device cuda --dtype bfloat16 --budgets 16 --no-plain --no-e2e --projections\n  ddtree-bench bench-engine --shape qwen3-8b --device cuda --dtype bfloat16 --batch 1,2,4,8,16 --budgets 16,32,64,128 --tau 16:8.6,32:9.3,64:9.75,128:10.2")
def bench_engine_cmd(
    ctx: typer.Context,
    model: O.Model = D.MODEL,
    draft: O.Draft = None,
    shape: Annotated[Optional[str], typer.Option("--shape", help="Random weights of a real shape instead of --model: qwen3-8b | qwen3-4b | qwen3-1.7b | qwen3-32b | llama3-8b (+ its 5-layer DFlash drafter), or the hybrid qwen3.6-27b (verify ms and GDN state memory per node, next to qwen3-32b; docs/hybrid-targets.md).")] = None,
    budgets: Annotated[str, typer.Option("--budgets", help="Tree budgets: 16..1024 (powers of two) or 16,48,100.")] = D.SWEEP_BUDGETS,
    prefix_len: Annotated[int, typer.Option("--prefix-len", help="Prompt / prefix tokens before the measured rounds.")] = D.BENCH_PREFIX_LEN,
    device: O.Device = D.DEVICE,
    dtype: O.Dtype = D.DTYPE,
    rounds: Annotated[int, typer.Option("--rounds", help="Measured rounds per method and budget (after a warmup generation).")] = D.BENCH_ROUNDS,
    verify_tokens: Annotated[str, typer.Option("--verify-tokens", help="Query-token counts of the verify-cost curve.")] = D.BENCH_VERIFY_TOKENS,
    curve_logit_scale: Annotated[float, typer.Option("--curve-logit-scale", min=0.01, help="The verify curve's trees are the tree of random draft logits times this: 3 gives wide trees (depth <= ~4), 12 the deep narrow trees of a confident drafter (depth to 15).")] = D.BENCH_CURVE_LOGIT_SCALE,
    tau: Annotated[Optional[str], typer.Option("--tau", help="Acceptance length per budget for the cost model, e.g. 16:8.6,64:9.75 (default: measured end to end on trained pairs).")] = None,
    graphs: Annotated[bool, typer.Option("--graphs/--no-graphs", help="Capture CUDA graphs in the fast engine.")] = True,
    layer_ops: Annotated[str, typer.Option("--layer-ops", help="Fast engine's layer ops: auto (fused Triton kernels on CUDA when they pass their self-test) | triton | torch (unfused twin).")] = "auto",
    plain: Annotated[bool, typer.Option("--plain/--no-plain", help="Also time the plain (eager, synchronising) engine.")] = True,
    e2e: Annotated[bool, typer.Option("--e2e/--no-e2e", help="End-to-end tok/s on suite prompts (pairs with a tokenizer: not --shape).")] = True,
    build_table: Annotated[bool, typer.Option("--build-table/--no-build-table", help="Time every tree builder per budget (CPU heap and vectorised; on CUDA also the Triton kernels, each compiled at each budget).")] = True,
    profile: Annotated[bool, typer.Option("--profile/--no-profile", help="Per-kernel profile (torch.profiler, CUDA activity) of the verify forward at each --verify-tokens n: top kernels with time and share, time by family, idle time. Taken last, in a second pass over the curve, so the profiler does not slow the timed rounds.")] = False,
    projections: Annotated[bool, typer.Option("--projections/--no-projections", help="Also time each weight projection's GEMMs alone (q/k/v, o_proj, gate/up, down over every layer, lm_head) at each --verify-tokens n: cuBLAS and the engine's own launch, each against the projection's weight read at 4.3 TB/s (or its FLOPs at 790 TFLOP/s): which GEMM sits furthest from its floor.")] = False,
    suite: O.Suite = D.SUITE,
    limit: Annotated[int, typer.Option("--limit", help="Prompts for the end-to-end runs.")] = D.BENCH_E2E_PROMPTS,
    max_new_tokens: O.MaxNewTokens = D.BENCH_E2E_MAX_NEW_TOKENS,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the result JSON here.")] = None,
    batch: Annotated[Optional[str], typer.Option("--batch", help="Instead: the batched fast loop at these batch sizes, e.g. 1,2,4,8,16 - per (batch, budget) stage times, each step's host wall time (step, gap = step - round) and output tok/s beside the single-request loop's round (x single; batch 1 also in a loop of max(batch) slots, as serve --max-batch N at concurrency 1), and the batched cost model's prediction of each batch from the others (tok/s and best budget; beyond the fitted batches' tokens the verify follows one request's verify forward, timed after the grid) beside them (perf/bench_batch.py); --out also gets a .csv beside it.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress lines.")] = False,
) -> None:
    """Stage timings of the reference engine per budget, verify-cost curve, and the cost model's best budget."""
    import json
    import sys

    from ddtree_bench.run_spec import parse_budgets
    from ddtree_bench.perf.costmodel import parse_points
    from ddtree_bench.errors import UsageError
    from ddtree_bench.records import json_safe

    spec_budgets = parse_budgets(budgets)
    try:
        parts = [x.strip() for x in verify_tokens.split(",")]
        if any(not x for x in parts):
            raise UsageError(f"--verify-tokens {verify_tokens!r}: empty item (two commas, or a comma at an end)")
        vt = sorted({int(x) for x in parts})
    except ValueError:
        raise UsageError(f"--verify-tokens must be a comma list of integers, got {verify_tokens!r}") from None
    if not vt or vt[0] < 1:
        raise UsageError("--verify-tokens needs positive token counts")
    if vt[-1] > D.MAX_BUDGET + 1:
        raise UsageError(f"--verify-tokens: {vt[-1]} is above the largest verify (MAX_BUDGET + 1 = {D.MAX_BUDGET + 1})")
    if prefix_len < 1:
        raise UsageError("--prefix-len must be at least 1")
    if rounds < 1:
        raise UsageError("--rounds must be at least 1")
    if layer_ops not in ("auto", "triton", "torch"):
        raise UsageError(f"--layer-ops must be auto, triton or torch, got {layer_ops!r}")
    if out is not None:
        from ddtree_bench.outpaths import check_output_file

        check_output_file(out, "--out")

    from ddtree_bench.engine.loading import resolve_device, torch_dtype
    from ddtree_bench.perf.bench import BenchSpec, run_bench
    from ddtree_bench.perf.shapes import SHAPES
    from ddtree_bench.perf.tables import render
    from ddtree_bench.results import write_json_atomic

    if resolve_device(device).type != "cuda" and layer_ops == "triton":
        raise UsageError("--layer-ops triton needs a CUDA device (the fused kernels are Triton); use auto or torch")
    torch_dtype(dtype)
    from ddtree_bench.perf.shapes import HYBRID_SHAPES

    if projections and (shape in HYBRID_SHAPES or batch is not None):
        raise UsageError("--projections times a dense target's single-request verify GEMMs: not with --batch or a hybrid --shape")
    model_given = getattr(ctx.get_parameter_source("model"), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")
    if shape is not None and (model_given or draft is not None):
        raise UsageError("--shape builds random weights of a real shape instead of --model / --draft: give one or the other")
    if shape in HYBRID_SHAPES:   # what the hybrid bench does not take: refused, not dropped
        unused = [flag for flag, given in (("--batch", batch is not None), ("--tau", tau is not None), ("--profile", profile),
                                           ("--verify-tokens", verify_tokens != D.BENCH_VERIFY_TOKENS))
                  if given]
        if unused:
            raise UsageError(f"{', '.join(unused)} do{'es' if len(unused) == 1 else ''} not apply to a hybrid --shape",
                             hint="it times the verify at each --budgets + 1 tokens, both commit modes, and the GDN state "
                                  "memory per node (docs/hybrid-targets.md)")
    if shape is not None and (shape in HYBRID_SHAPES or shape in SHAPES):
        from ddtree_bench.perf.shapes import check_fits

        check_fits(shape, dtype, device)
    if shape in HYBRID_SHAPES:   # the hybrid target's verify and state memory, then its dense twin (perf/bench_hybrid.py)
        from ddtree_bench.perf.bench_hybrid import bench_hybrid, render_hybrid

        say = (lambda s: None) if quiet else (lambda s: print(f"[bench-engine] {s}", file=sys.stderr, flush=True))
        sizes = sorted({1} | {b + 1 for b in spec_budgets})
        result = bench_hybrid(shape, device=device, dtype=dtype, sizes=sizes, prefix_len=prefix_len, reps=rounds, say=say)
        typer.echo(render_hybrid(result))
        if out is not None:
            from ddtree_bench.outpaths import make_dirs

            make_dirs(out.parent)
            write_json_atomic(out, json_safe(result))
        typer.echo(json.dumps(json_safe(result)))
        return
    if shape is not None and shape not in SHAPES:
        raise UsageError(f"unknown --shape {shape!r}; expected one of {', '.join(list(SHAPES) + list(HYBRID_SHAPES))}")
    spec = BenchSpec(model=model, draft=draft, shape=shape, budgets=spec_budgets, prefix_len=prefix_len, device=device,
                     dtype=dtype, rounds=rounds, verify_tokens=vt, graphs=graphs, layer_ops=layer_ops, plain=plain, e2e=e2e, build_table=build_table, profile=profile, projections=projections, curve_logit_scale=curve_logit_scale, suite=suite,
                     limit=limit, max_new_tokens=max_new_tokens, tau=parse_points(tau, "--tau") if tau else None)
    say = (lambda s: None) if quiet else (lambda s: print(f"[bench-engine] {s}", file=sys.stderr, flush=True))
    if batch is not None:
        from ddtree_bench.perf.bench_batch import batch_cli

        return batch_cli(spec, batch, out, say)
    result = run_bench(spec, say)
    typer.echo(render(result))
    if out is not None:
        from ddtree_bench.outpaths import make_dirs

        make_dirs(out.parent)
        write_json_atomic(out, result)
        typer.echo(f"wrote {out}")
    typer.echo(json.dumps(json_safe(result), separators=(",", ":")))
