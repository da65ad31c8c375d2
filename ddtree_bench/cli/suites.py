"""`ddtree-bench suites`: list the benchmark suites; `suites show NAME`: print rendered user turns.

The listing reads only the suite YAML files (no dataset is loaded); `show` loads the suite (bundled
data, or HF `datasets` for the others) and prints the first prompts exactly as a run sends them,
so templates can be checked by eye, or, with `--jsonl`, exports them as a custom suite file.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ddtree_bench.cli import options as O
from ddtree_bench.cli.app import app
from ddtree_bench.errors import UsageError

suites_app = typer.Typer(help="List benchmark suites (no arguments), or show one's rendered prompts.",
                         epilog="\b\nExamples:\n  ddtree-bench suites\n  ddtree-bench suites --json\n  ddtree-bench suites show mt-bench --limit 1")
app.add_typer(suites_app, name="suites")

_TEMPLATE_WIDTH = 64


def _one_line(text: str, width: int = _TEMPLATE_WIDTH) -> str:
    s = text.replace("\\", "\\\\").replace("\n", "\\n")
    return s if len(s) <= width else s[: width - 3] + "..."


def _rows_table(rows: list[list[str]], header: list[str]) -> str:
    cells = [header, *rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


@suites_app.callback(invoke_without_command=True)
def suites_list(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print the list as JSON.")] = False,
) -> None:
    """List suites: name, source, whether it works offline, default n, subset rule, template."""
    if ctx.invoked_subcommand is not None:
        return
    import json

    from ddtree_bench.suites import catalog
    from ddtree_bench.suites.prompts import SMOKE

    entries = [{"name": "smoke", "source": "built-in", "data": "offline", "n": len(SMOKE), "subset": None,
                "template": "3 fixed prompts (one two-turn)", "description": "Tiny built-in smoke test.", "file": None}]
    for d in catalog.missing_env_dirs():   # a typo in the variable would otherwise list only the built-in suites
        typer.echo(f"note: {catalog.ENV_DIRS} names {d}, which is not a directory", err=True)
    specs, errors = catalog.list_specs_and_errors()
    for spec in specs:
        try:
            row = {"name": spec.name, "source": catalog.describe_source(spec),
                   "data": "offline" if catalog.is_offline(spec) else "needs datasets",
                   "n": spec.n, "subset": spec.subset, "template": spec.template_text(),
                   "description": spec.description, "file": str(spec.path)}
        except UsageError as e:  # a mix naming a broken or missing part
            errors.append(UsageError(f"{spec.path}: {e}"))
            continue
        entries.append(row)
    if as_json:
        typer.echo(json.dumps(entries, indent=2, ensure_ascii=False))
        _refuse_broken(errors)
        return
    rows = [[e["name"], e["source"] if len(e["source"]) <= 48 else e["source"][:45] + "...", e["data"],
             "all" if e["n"] is None else str(e["n"]), e["subset"] or "-", _one_line(e["template"])] for e in entries]
    typer.echo(_rows_table(rows, ["suite", "source", "data", "n", "subset", "template"]))
    typer.echo("\n`ddtree-bench suites show NAME` prints a suite's rendered prompts; a JSONL file of "
               "{\"id\", \"turns\"} is a suite too. Suite dirs: " + ", ".join(str(d) for d in catalog.suite_dirs()))
    _refuse_broken(errors)


def _refuse_broken(errors: list[UsageError]) -> None:
    """After the listing of the good suites: each broken suite file one line, then exit 2 (bad input)."""
    if not errors:
        return
    for e in errors[:-1]:
        typer.echo(f"error: {e}", err=True)
    raise UsageError(str(errors[-1]), hint=f"{len(errors)} suite file(s) could not be read; the suites listed above can")


@suites_app.command("show", epilog="\b\nExamples:\n  ddtree-bench suites show gsm8k --limit 2")
def suites_show(
    name: Annotated[str, typer.Argument(help="Suite name, suite YAML, or JSONL file.")],
    limit: Annotated[int, typer.Option("--limit", help="How many prompts to print (the first of the run order).")] = 3,
    n: Annotated[Optional[int], typer.Option("--n", help="Sample count to select (default: the suite's n), as `run --limit`.")] = None,
    subset: O.Subset = None,
    full: Annotated[bool, typer.Option("--full", help="Print long turns in full (default: cut at 2000 characters).")] = False,
    jsonl: Annotated[bool, typer.Option("--jsonl", help="Print the selected prompts as {\"id\", \"turns\"} JSONL (a custom suite file).")] = False,
) -> None:
    """Print the first prompts of a suite exactly as a run would send them (user turns only)."""
    import json

    from ddtree_bench.suites.prompts import load_suite

    if limit <= 0:
        raise UsageError(f"--limit must be a positive integer, got {limit}")
    loaded = load_suite(name, n, subset=subset)
    prompts, info = loaded.prompts, loaded.info
    if jsonl:
        for p in prompts:
            typer.echo(json.dumps({"id": p.prompt_id, "turns": p.turns}, ensure_ascii=False))
        return
    typer.echo(f"suite     {info.name}" + (f"  ({info.spec_file})" if info.spec_file else ""))
    typer.echo(f"source    {info.source}")
    avail = "?" if info.num_available is None else str(info.num_available)
    typer.echo(f"selected  {info.num_prompts} of {avail} items, subset rule {info.subset_rule or 'file order'}")
    if info.template is not None:
        typer.echo(f"template  {_one_line(info.template, 200)}")
    for k, p in enumerate(prompts[:limit]):
        meta = ", ".join(f"{key} {val}" for key, val in p.meta.items() if key in ("index", "category", "suite"))
        typer.echo(f"\n=== [{k + 1}/{info.num_prompts}] id {p.prompt_id}" + (f" ({meta})" if meta else ""))
        for t, turn in enumerate(p.turns):
            if len(p.turns) > 1:
                typer.echo(f"--- turn {t + 1} (user)" + (f" - sent after the model's own answer to turn {t}" if t else ""))
            cut = not full and len(turn) > 2000
            typer.echo(turn[:2000] + (f"\n[... {len(turn) - 2000} more characters; --full prints all]" if cut else ""))
