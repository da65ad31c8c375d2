"""`ddtree-bench baseline record` and `ddtree-bench baseline import`: make or import greedy baselines."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ddtree_bench import defaults as D
from ddtree_bench.cli import options as O
from ddtree_bench.cli.app import baseline_app

OutFile = Annotated[Path, typer.Option("--out", help="Baseline file to write (JSONL), e.g. baselines/toy-gsm8k.jsonl.")]
Subset = Annotated[Optional[str], typer.Option("--subset", help="Subset rule: zlab-paper | zlab-current | first (default: the suite's).")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]


@baseline_app.command("record", epilog="\b\nExamples:\n  ddtree-bench baseline record --model toy --suite gsm8k --limit 8 --out baselines/mine.jsonl\n  ddtree-bench baseline record --backend vllm --url http://127.0.0.1:8000 --model /models/Qwen3-8B --suite gsm8k --out b.jsonl")
def record_cmd(
    out: OutFile,
    model: O.Model = D.MODEL,
    draft: O.Draft = None,
    suite: O.Suite = D.SUITE,
    limit: O.Limit = None,
    subset: Subset = None,
    max_new_tokens: O.MaxNewTokens = D.MAX_NEW_TOKENS,
    dtype: O.Dtype = D.DTYPE,
    device: O.Device = D.DEVICE,
    accept_method: Annotated[Optional[str], typer.Option(
        "--accept-method", help="Also decode with dflash | ddtree and store its acceptance lengths (a reference tau for gate).")] = None,
    budget: O.Budget = D.BUDGET,
    backend: Annotated[str, typer.Option("--backend", help="inprocess (the reference engine) | vllm | sglang | standalone | openai: record from the running server at --url, gaps from its logprobs.")] = D.BACKEND,
    url: O.Url = None,
    api_key: O.ApiKey = None,
    timeout: O.Timeout = D.REQUEST_TIMEOUT_S,
    top_logprobs: Annotated[int, typer.Option("--top-logprobs", help="Server baselines: top_logprobs asked per token (>= 2; the gap is top-1 minus top-2).")] = D.SERVER_TOP_LOGPROBS,
    quiet: Quiet = False,
) -> None:
    """Record an AR-greedy baseline: prompt ids, output ids and text, and the top-1 minus top-2 logit gap
    at every output position - from the reference engine, or from a running server's logprobs (--backend, --url)."""
    from ddtree_bench.baselines.file import check_out_file, write_baseline
    from ddtree_bench.baselines.record import record, record_from_server

    check_out_file(out)
    if backend != "inprocess":
        if not url:
            from ddtree_bench.errors import UsageError

            raise UsageError(f"--backend {backend} needs --url (the server's base URL)")
        header, entries = record_from_server(backend, url, model, suite, limit, max_new_tokens, subset, api_key, timeout,
                                             top_logprobs, progress=not quiet)
        write_baseline(out, header, entries)
        n_gaps = sum(1 for e in entries if e.logit_gap is not None)
        typer.echo(f"baseline: {out} ({len({e.prompt_id for e in entries})} prompts, {len(entries)} turns, "
                   f"{sum(len(e.output_ids) for e in entries)} tokens from {backend} {header['url']} "
                   f"{header.get('server_version') or ''}; logit gaps from logprobs for {n_gaps}/{len(entries)} turns, "
                   f"near-tie threshold {header['near_tie_gap']:g})")
        return
    header, entries = record(model, draft, suite, limit, max_new_tokens, dtype, device, subset, accept_method, budget,
                             progress=not quiet)
    write_baseline(out, header, entries)
    n_prompts = len({e.prompt_id for e in entries})
    extra = ""
    if accept_method:
        from ddtree_bench.metrics import acceptance_length_mean

        tau = acceptance_length_mean([e.as_record() for e in entries])
        extra = f"; {accept_method} tau {tau:.2f}, {header['num_accept_output_mismatches']} outputs differ from AR"
    typer.echo(f"baseline: {out} ({n_prompts} prompts, {len(entries)} turns, {sum(len(e.output_ids) for e in entries)} tokens{extra})")


@baseline_app.command("import", epilog="\b\nExamples:\n  ddtree-bench baseline import authors_output.pt --trust-pickle --tokenizer /models/Qwen3-8B --suite gsm8k --out b.jsonl")
def import_cmd(
    pt: Annotated[Path, typer.Argument(help="The DDTree authors' benchmark file (benchmark.py --save-path).", show_default=False)],
    out: OutFile,
    tokenizer: Annotated[str, typer.Option("--tokenizer", help="Target model directory with the tokenizer and chat template (or toy / toy-hybrid / random).")],
    trust_pickle: Annotated[bool, typer.Option("--trust-pickle", help="Allow loading RUN.pt: it is a pickle, and loading a pickle runs code from the file.")] = False,
    suite: Annotated[Optional[str], typer.Option("--suite", help="Suite the responses came from (default: the file's args.dataset).")] = None,
    limit: Annotated[Optional[int], typer.Option("--limit", help="Prompts to match against (default: the file's args.max_samples).")] = None,
    subset: Subset = None,
    method: Annotated[str, typer.Option("--method", help="Which of their methods' outputs become the baseline: baseline (their AR) | dflash | ddtree_tbB.")] = "baseline",
    accept_from: Annotated[Optional[str], typer.Option("--accept-from", help="Which method's acceptance lengths to carry (default: --method's; AR's are dropped).")] = None,
    gaps_from_model: Annotated[Optional[str], typer.Option("--gaps-from-model", help="Fill logit gaps by re-scoring every output with this target (toy, random or a directory).")] = None,
    dtype: O.Dtype = D.DTYPE,
    device: O.Device = D.DEVICE,
    quiet: Quiet = False,
) -> None:
    """Import a DDTree benchmark .pt as a baseline, matching responses to the suite by their prompt tokens."""
    from ddtree_bench.baselines.file import check_out_file, write_baseline
    from ddtree_bench.baselines.import_pt import import_baseline

    check_out_file(out)
    header, result = import_baseline(pt, trust_pickle, tokenizer, suite, limit, subset, method, accept_from,
                                     gaps_from_model, dtype, device, progress=not quiet)
    write_baseline(out, header, result.entries)
    how = ", ".join(f"{v} by {k}" for k, v in sorted(result.matched_by.items()))
    typer.echo(f"baseline: {out} ({len(result.entries)} of {header['num_responses']} responses matched: {how}; "
               f"logit gaps {'re-scored' if gaps_from_model else 'unknown (null)'})")
    if result.unmatched:
        typer.echo(f"warning: {len(result.unmatched)} responses match no prompt of suite {header['suite']!r} "
                   f"(indices {result.unmatched[:10]}{' ...' if len(result.unmatched) > 10 else ''})", err=True)
    if result.duplicates:
        typer.echo(f"warning: {len(result.duplicates)} responses repeat an already matched prompt/turn (kept the first)", err=True)
