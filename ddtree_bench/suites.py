"""Benchmark suites -> `Prompt`s.

A suite is a name (`suites/<name>.yaml`, see `ddtree-bench suites`), a suite YAML file, a JSONL file
of `{"id": str, "turns": [str, ...]}` (z-lab's cache format), or the built-in `smoke` suite.
`load_prompts` returns the prompts and a `SuiteInfo` that baselines and run.json record (source,
subset rule, template, count). `user_turns` applies one suite's exact template to one raw item (the
toy pair's training data uses it, so training and evaluation prompts agree).

Suite YAML files are looked up, first match wins, in: every directory of `DDTREE_BENCH_SUITES`
(os.pathsep-separated), the package's `suite_specs/` (shipped as package data; a link to the
top-level `suites/` in a source checkout), and the top-level `suites/` of a source checkout.
The schema is in `suite_spec.py`, subset rules in `subsets.py`, data loading in `suite_sources.py`.
Knows nothing of models or HTTP.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ddtree_bench.errors import UsageError
from ddtree_bench.jsonl import iter_jsonl
from ddtree_bench.records import Prompt
from ddtree_bench.subsets import check_rule, select_indices
from ddtree_bench.suite_spec import SuiteSpec, load_spec_file

SMOKE = [
    Prompt("smoke-0", ["What is 12 + 30? Answer briefly."]),
    Prompt("smoke-1", ["Write a Python function that returns the square of a number."]),
    Prompt("smoke-2", ["Name three colours.", "Now name three more."]),
]
ENV_DIRS = "DDTREE_BENCH_SUITES"
PACKAGE_DIR = Path(__file__).resolve().parent
BUILTIN_DIRS = (PACKAGE_DIR / "suite_specs", PACKAGE_DIR.parent / "suites")
_SPEC_CACHE: dict[Path, tuple[int, SuiteSpec]] = {}
_FILES_CACHE: dict[str, Any] = {}


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


# --------------------------------------------------------------------------- suite YAML lookup


def suite_dirs() -> list[Path]:
    """Directories searched for `<name>.yaml`, in priority order (existing ones only, deduplicated)."""
    dirs = [Path(d).expanduser() for d in os.environ.get(ENV_DIRS, "").split(os.pathsep) if d.strip()]
    out: list[Path] = []
    for d in [*dirs, *BUILTIN_DIRS]:
        if d.is_dir() and all(d.resolve() != o.resolve() for o in out):
            out.append(d)
    return out


def _spec_files() -> dict[str, Path]:
    """name -> YAML path, first directory wins. Cached until a directory's mtime changes."""
    dirs = suite_dirs()
    key = tuple((str(d), d.stat().st_mtime_ns) for d in dirs)
    if _FILES_CACHE.get("key") == key:
        return _FILES_CACHE["files"]
    found: dict[str, Path] = {}
    for d in dirs:
        for p in sorted([*d.glob("*.yaml"), *d.glob("*.yml")]):
            found.setdefault(p.stem, p)
    _FILES_CACHE.update(key=key, files=found)
    return found


def _load_spec(path: Path) -> SuiteSpec:
    path = path.resolve()
    mtime = path.stat().st_mtime_ns
    hit = _SPEC_CACHE.get(path)
    if hit is not None and hit[0] == mtime:
        return hit[1]
    spec = load_spec_file(path)
    _SPEC_CACHE[path] = (mtime, spec)
    return spec


def suite_names() -> list[str]:
    """Every suite name: `smoke` plus every suite YAML found."""
    return sorted({"smoke", *_spec_files()})


def get_spec(name: str) -> SuiteSpec:
    """The validated definition of a named suite (or of a suite YAML path)."""
    if name.endswith((".yaml", ".yml")):
        p = Path(name).expanduser()
        if not p.is_file():
            raise UsageError(f"suite file {p} does not exist")
        return _load_spec(p)
    path = _spec_files().get(name)
    if path is None:
        known = ", ".join(suite_names()) or "none found"
        raise UsageError(f"unknown suite {name!r} (known: {known})",
                         hint="see `ddtree-bench suites`, or pass a JSONL file of {\"id\", \"turns\"}")
    return _load_spec(path)


def list_specs() -> list[SuiteSpec]:
    """Every suite YAML found, validated (a malformed one is a UsageError naming its file)."""
    return [_load_spec(p) for _, p in sorted(_spec_files().items())]


def is_offline(spec: SuiteSpec, _depth: int = 0) -> bool:
    """True when the suite loads with no network and no `datasets` (bundled or local files only)."""
    if spec.mix is None:
        return spec.source is not None and spec.source.offline
    if _depth > 8:
        raise UsageError(f"suite {spec.name!r}: mix parts nest too deeply (a cycle?)")
    return all(is_offline(get_spec(p.suite), _depth + 1) for p in spec.mix)


def describe_source(spec: SuiteSpec) -> str:
    if spec.mix is not None:
        return "mix of " + ", ".join(p.suite for p in spec.mix)
    assert spec.source is not None
    return spec.source.describe()


# --------------------------------------------------------------------------- public API


def user_turns(name: str, item: dict[str, Any]) -> list[str]:
    """The user turns that suite `name` makes of one raw dataset item, with its exact template.

    E.g. `user_turns("gsm8k", {"question": q})` -> [q + "\\nPlease reason step by step, ..."].
    """
    return get_spec(name).render(item)


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

    from ddtree_bench.suite_sources import load_items

    assert spec.source is not None
    items = load_items(spec.name, spec.source, spec.path.parent)
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


def load_prompts(suite: str, limit: int | None = None, *, subset: str | None = None) -> tuple[list[Prompt], SuiteInfo]:
    """Prompts of a suite, in run order, and what baselines / run.json record about them.

    limit: number of prompts (None: the suite's default `n`; custom JSONL: every prompt).
    subset: override the suite's subset rule (zlab-paper | zlab-current | first). With a shuffling
    rule, `limit` plays z-lab's `max_samples`: the first `limit` items of the shuffled order, or
    every item in source order when the source has no more than `limit` items.
    """
    check_rule(subset)
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0):
        raise UsageError(f"--limit must be a positive integer, got {limit!r}")
    is_yaml = suite.endswith((".yaml", ".yml"))
    if not is_yaml and (suite.endswith(".jsonl") or (suite not in ("smoke", *_spec_files()) and Path(suite).is_file())):
        path = Path(suite).expanduser()
        all_prompts = read_jsonl_suite(path)
        prompts = [all_prompts[i] for i in select_indices(len(all_prompts), limit, subset)]
        info = SuiteInfo(name=path.stem, source=str(path), subset_rule=subset, num_available=len(all_prompts))
    elif suite == "smoke":
        prompts = [SMOKE[i] for i in select_indices(len(SMOKE), limit, subset)]
        info = SuiteInfo(name="smoke", source="built-in", subset_rule=subset, num_available=len(SMOKE))
    else:
        spec = get_spec(suite)
        rule = subset or spec.subset
        prompts, available = _spec_prompts(spec, limit if limit is not None else spec.n, rule)
        info = SuiteInfo(name=spec.name, source=describe_source(spec), subset_rule=rule, template=spec.template_text(),
                         default_n=spec.n, num_available=available, spec_file=str(spec.path))
    info.num_prompts = len(prompts)
    return prompts, info
