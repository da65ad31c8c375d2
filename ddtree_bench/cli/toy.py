"""`ddtree-bench toy train`: reproduce the bundled toy target + DFlash drafter pair."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ddtree_bench.cli.app import toy_app


@toy_app.command("train", epilog="\b\nExamples:\n  ddtree-bench toy train --out /tmp/toy --device cuda\n  ddtree-bench toy train --hybrid --out /tmp/toy-hybrid --device cuda --time-budget-s 420")
def toy_train_cmd(
    out: Annotated[Path, typer.Option("--out", help="Directory to write target/ and draft/ into.")],
    device: Annotated[str, typer.Option("--device", help="cpu | cuda (the dense pair: minutes on one GPU, hours on a CPU; --hybrid: a GPU only).")] = "cpu",
    seed: Annotated[Optional[int], typer.Option("--seed", help="Seed (default: the recipe's).")] = None,
    target_steps: Annotated[Optional[int], typer.Option("--target-steps", help="Override the recipe's target steps.")] = None,
    draft_steps: Annotated[Optional[int], typer.Option("--draft-steps", help="Override the recipe's drafter steps.")] = None,
    distill_contexts: Annotated[Optional[int], typer.Option("--distill-contexts", help="Override the number of distillation contexts.")] = None,
    max_files: Annotated[Optional[int], typer.Option("--max-files", help="Use only the first N stdlib files (quick trials).")] = None,
    hybrid: Annotated[bool, typer.Option("--hybrid", help="Train the toy hybrid pair (Qwen3.5-style GDN + attention target, "
                                         "Qwen3.6-style drafter; needs transformers) instead of the dense one.")] = False,
    time_budget_s: Annotated[Optional[float], typer.Option("--time-budget-s", help="With --hybrid: cap each stage's steps "
                                                           "to fit this wall time (TRAINING.json records the counts that ran).")] = None,
) -> None:
    """Train the toy pair (target, then a DFlash drafter on the target's greedy outputs) into --out."""
    import dataclasses

    from ddtree_bench.engine.loading import resolve_device
    from ddtree_bench.errors import UsageError
    from ddtree_bench.results import check_out_dir
    from ddtree_bench.toy.train import Recipe, train

    resolve_device(device)
    check_out_dir(out)
    overrides = {k: v for k, v in dict(seed=seed, target_steps=target_steps, draft_steps=draft_steps,
                                       distill_contexts=distill_contexts).items() if v is not None}
    for k, v in overrides.items():
        if v < 0 or (k != "seed" and v == 0):
            raise UsageError(f"--{k.replace('_', '-')} must be positive, got {v}")
    if time_budget_s is not None and (not hybrid or time_budget_s <= 0):
        raise UsageError("--time-budget-s needs --hybrid and a positive number of seconds")
    if hybrid:
        from ddtree_bench.toy import train_hybrid

        train_hybrid.require_transformers()
        if resolve_device(device).type != "cuda":
            raise UsageError("toy train --hybrid needs a CUDA device: its target batches (64 x 1024 tokens through "
                             "transformers' reference Gated DeltaNet) do not fit a 24 GiB CPU machine",
                             hint="pass --device cuda, or train the dense pair on a CPU (without --hybrid)")
        recipe = dataclasses.replace(train_hybrid.HybridRecipe(), time_budget_s=time_budget_s, **overrides)
        train_hybrid.train(recipe, out, device=device, max_files=max_files, log=lambda m: typer.echo(m, err=True))
        typer.echo(f"toy hybrid pair: {out}")
        return
    recipe = dataclasses.replace(Recipe(), **overrides)
    train(recipe, out, device=device, max_files=max_files, log=lambda m: typer.echo(m, err=True))
    typer.echo(f"toy pair: {out}")
