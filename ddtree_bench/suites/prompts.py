"""Benchmark suites -> `Prompt`s: the prompts of one suite in run order, and what is recorded about them.

A suite is a name (`suites/<name>.yaml`, see `ddtree-bench suites` and `catalog.py`), a suite YAML
file, a JSONL file of `{"id": str, "turns": [str, ...]}` (z-lab's cache format), or the built-in
`smoke` suite. `load_suite` is the one entry a run makes into this package: it resolves the name
once and returns a `SuitePrompts` record (the prompts in run order, and the `SuiteInfo` that
baselines and run.json record: source, subset rule, template, count) that the rest consumes.
The schema is in `spec.py`, subset rules in `subsets.py`, data loading in `sources.py`, the lookup
of named suites in `catalog.py`. Knows nothing of models or HTTP.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ddtree_bench.errors import UsageError
from ddtree_bench.jsonl import iter_jsonl
from ddtree_bench.records import Prompt
from ddtree_bench.suites.catalog import describe_source, find_spec, get_spec
from ddtree_bench.suites.spec import SuiteSpec
from ddtree_bench.suites.subsets import check_rule, select_indices

SMOKE = [
    Prompt("smoke-0", ["What is 12 + 30? Answer briefly."]),
    Prompt("smoke-1", ["Write a Python function that returns the square of a number."]),
    Prompt("smoke-2", ["Name three colours.", "Now name three more."]),
]


@dataclass
class SuiteInfo:
    name: str
    source: str
    subset_rule: str | None = None     # zlab-paper | zlab-current | first | None (all, in file order)
    template: str | None = None
    num_prompts: int = 0
    default_n: int | None = None       # the suite's default sample count (None: every item)
    num_available: int | None = None   # items in the source before selection
    spec_file: str | None = None       # the suite YAML that defined it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SuitePrompts:
    """One suite as a run uses it, loaded once (`load_suite`): what was asked, the prompts in run
    order and the `SuiteInfo` recorded about them. The runner, a sweep (for every point of the
    suite) and the baseline commands consume this record; none of them enters the package again."""

    suite: str                 # as asked: a suite name, a suite YAML or a JSONL path
    limit: int | None          # as asked (None: the suite's default n)
    subset: str | None         # as asked (None: the suite's own rule)
    prompts: list[Prompt]
    info: SuiteInfo

    def answers(self, suite: str, limit: int | None, subset: str | None) -> bool:
        """Whether this is what `load_suite(suite, limit, subset=subset)` returns."""
        return (self.suite, self.limit, self.subset) == (suite, limit, subset)


# --------------------------------------------------------------------------- custom JSONL suites


def read_jsonl_suite(path: Path) -> list[Prompt]:
    """Custom suite: one {"id": str, "turns": [str, ...]} per line. Errors name the line.

    `question_id` (FastChat / Spec-Bench question files) is accepted when `id` is absent; with
    neither, the id is the 0-based line index. Other keys go to `Prompt.meta`.
    """
    path = Path(path)
    if not path.exists():
        raise UsageError(f"suite file {path} does not exist")
    prompts, seen = [], set()
    for i, obj in iter_jsonl(path, expect='an object with "id" and "turns"'):
        turns = obj.get("turns")
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise UsageError(f"{path}:{i}: \"turns\" must be a non-empty list of strings")
        for t, text in enumerate(turns):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:   # a JSON escape of half a surrogate pair: no tokenizer takes it
                raise UsageError(f"{path}:{i}: turn {t} holds a lone surrogate ({text[e.start]!r} at character {e.start}), "
                                 "not text", hint="a \\uD8xx escape needs its \\uDCxx pair after it") from None
        raw_id = obj.get("id", obj.get("question_id", i - 1))
        pid = str(raw_id)
        if pid in seen:
            raise UsageError(f"{path}:{i}: duplicate id {pid!r}")
        seen.add(pid)
        max_new = obj.get("max_new_tokens")
        if max_new is not None and (not isinstance(max_new, int) or isinstance(max_new, bool) or max_new <= 0):
            raise UsageError(f"{path}:{i}: \"max_new_tokens\" must be a positive integer")
        prompts.append(Prompt(pid, turns, max_new, {k: v for k, v in obj.items() if k not in ("id", "turns", "max_new_tokens")}))
    if not prompts:
        raise UsageError(f"suite file {path} has no prompts")
    return prompts


# --------------------------------------------------------------------------- public API


def _spec_prompts(spec: SuiteSpec, n: int | None, rule: str | None, _depth: int = 0) -> tuple[list[Prompt], int]:
    """(prompts in run order, number of items available) for a suite definition."""
    if spec.mix is not None:
        if _depth > 8:
            raise UsageError(f"suite {spec.name!r}: mix parts nest too deeply (a cycle?)")
        parts, available = [], 0
        for part in spec.mix:
            sub = get_spec(part.suite)
            got, avail = _spec_prompts(sub, part.n, rule, _depth + 1)
            available += min(avail, part.n)
            parts.append([Prompt(f"{part.suite}/{p.prompt_id}", p.turns, p.max_new_tokens,
                                 {**p.meta, "category": part.category, "suite": part.suite}) for p in got])
        # round-robin over the parts, so that any prefix (--limit) covers every category evenly
        mixed = [ps[i] for i in range(max(map(len, parts))) for ps in parts if i < len(ps)]
        return (mixed if n is None else mixed[:n]), available

    from ddtree_bench.suites.sources import load_items

    assert spec.source is not None
    items = load_items(spec.name, spec.source, spec.path.parent)
    if spec.id_field is not None and items and not any(isinstance(it, dict) and it.get(spec.id_field) is not None
                                                       for it in items):   # a misspelt field, not items without ids
        fields = sorted({k for it in items[:50] if isinstance(it, dict) for k in it})
        raise UsageError(f"suite {spec.name!r}: id_field {spec.id_field!r} is in none of its {len(items)} items "
                         f"(their fields: {', '.join(fields[:12])})",
                         hint="fix id_field, or drop it to use the items' 0-based indices as ids")
    prompts, seen = [], set()
    for idx in select_indices(len(items), n, rule):
        item = items[idx]
        pid = spec.item_id(item, idx)
        if pid in seen:
            raise UsageError(f"suite {spec.name!r}: duplicate id {pid!r} (field {spec.id_field!r}, item {idx})")
        seen.add(pid)
        meta: dict[str, Any] = {"index": idx}
        if spec.category_field is not None and item.get(spec.category_field) is not None:
            meta["category"] = item[spec.category_field]
        prompts.append(Prompt(pid, spec.render(item, where=f"item {idx} ({pid})"), None, meta))
    return prompts, len(items)


def _resolve(suite: str) -> SuiteSpec | Path | None:
    """What `suite` names, looked up once: a suite definition (a named suite or a YAML file), a
    custom JSONL file, or None for the built-in smoke suite. An unknown name is a UsageError."""
    if suite.endswith((".yaml", ".yml")):
        return get_spec(suite)
    if suite == "smoke":
        return None
    if not suite.endswith(".jsonl"):
        spec = find_spec(suite)
        if spec is not None:
            return spec
        if not Path(suite).is_file():
            return get_spec(suite)  # raises: unknown suite, naming the known ones
    return Path(suite).expanduser()


def load_suite(suite: str, limit: int | None = None, *, subset: str | None = None) -> SuitePrompts:
    """Prompts of a suite, in run order, and what baselines / run.json record about them.

    limit: number of prompts (None: the suite's default `n`; custom JSONL: every prompt).
    subset: override the suite's subset rule (zlab-paper | zlab-current | first). With a shuffling
    rule, `limit` plays z-lab's `max_samples`: the first `limit` items of the shuffled order, or
    every item in source order when the source has no more than `limit` items.
    """
    check_rule(subset)
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0):
        raise UsageError(f"--limit must be a positive integer, got {limit!r}")
    found = _resolve(suite)
    if isinstance(found, Path):
        all_prompts = read_jsonl_suite(found)
        prompts = [all_prompts[i] for i in select_indices(len(all_prompts), limit, subset)]
        info = SuiteInfo(name=found.stem, source=str(found), subset_rule=subset, num_available=len(all_prompts))
    elif found is None:
        prompts = [SMOKE[i] for i in select_indices(len(SMOKE), limit, subset)]
        info = SuiteInfo(name="smoke", source="built-in", subset_rule=subset, num_available=len(SMOKE))
    else:
        rule = subset or found.subset
        prompts, available = _spec_prompts(found, limit if limit is not None else found.n, rule)
        info = SuiteInfo(name=found.name, source=describe_source(found), subset_rule=rule, template=found.template_text(),
                         default_n=found.n, num_available=available, spec_file=str(found.path))
    info.num_prompts = len(prompts)
    return SuitePrompts(suite, limit, subset, prompts, info)
