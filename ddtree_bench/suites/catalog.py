"""The named suites: where suite YAML files are found, and each one's validated `SuiteSpec`.

Suite YAML files are looked up, first match wins, in: every directory of `DDTREE_BENCH_SUITES`
(os.pathsep-separated), the package's `suite_specs/` (shipped as package data; a link to the
top-level `suites/` in a source checkout), and the top-level `suites/` of a source checkout.
Lookups and parsed specs are cached until a directory's or file's mtime changes. `user_turns`
applies one suite's exact template to one raw item (the toy pair's training data uses it, so
training and evaluation prompts agree).
Knows file names and the schema (`spec.py`); nothing of prompts' selection, data files or models.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ddtree_bench.errors import UsageError
from ddtree_bench.suites.spec import SuiteSpec, load_spec_file

ENV_DIRS = "DDTREE_BENCH_SUITES"
PACKAGE_DIR = Path(__file__).resolve().parent.parent   # ddtree_bench/
BUILTIN_DIRS = (PACKAGE_DIR / "suite_specs", PACKAGE_DIR.parent / "suites")
_SPEC_CACHE: dict[Path, tuple[int, SuiteSpec]] = {}
_FILES_CACHE: dict[str, Any] = {}


def suite_dirs() -> list[Path]:
    """Directories searched for `<name>.yaml`, in priority order (existing ones only, deduplicated)."""
    dirs = [Path(d).expanduser() for d in os.environ.get(ENV_DIRS, "").split(os.pathsep) if d.strip()]
    out: list[Path] = []
    for d in [*dirs, *BUILTIN_DIRS]:
        if d.is_dir() and all(d.resolve() != o.resolve() for o in out):
            out.append(d)
    return out


def missing_env_dirs() -> list[Path]:
    """Directories DDTREE_BENCH_SUITES names that do not exist (searched as empty; `suites` says so)."""
    return [Path(d).expanduser() for d in os.environ.get(ENV_DIRS, "").split(os.pathsep)
            if d.strip() and not Path(d).expanduser().is_dir()]


def spec_files() -> dict[str, Path]:
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
    return sorted({"smoke", *spec_files()})


def get_spec(name: str) -> SuiteSpec:
    """The validated definition of a named suite (or of a suite YAML path)."""
    if name.endswith((".yaml", ".yml")):
        p = Path(name).expanduser()
        if not p.is_file():
            raise UsageError(f"suite file {p} does not exist")
        return _load_spec(p)
    spec = find_spec(name)
    if spec is None and name == "smoke":
        raise UsageError("the built-in smoke suite has no definition (it is three prompts in the code), so it cannot "
                         "be part of a mix", hint="mix suites that `ddtree-bench suites` lists with a file")
    if spec is None:
        known = ", ".join(suite_names()) or "none found"
        raise UsageError(f"unknown suite {name!r} (known: {known})",
                         hint="see `ddtree-bench suites`, or pass a JSONL file of {\"id\", \"turns\"}")
    return spec


def find_spec(name: str) -> SuiteSpec | None:
    """The validated definition of the suite YAML named `name`, or None when no directory has one."""
    path = spec_files().get(name)
    return None if path is None else _load_spec(path)


def list_specs() -> list[SuiteSpec]:
    """Every suite YAML found, validated (a malformed one is a UsageError naming its file)."""
    return [_load_spec(p) for _, p in sorted(spec_files().items())]


def list_specs_and_errors() -> tuple[list[SuiteSpec], list[UsageError]]:
    """Every suite YAML that loads, and the error of each that does not (the listing shows the good ones)."""
    specs, errors = [], []
    for _, p in sorted(spec_files().items()):
        try:
            specs.append(_load_spec(p))
        except UsageError as e:
            errors.append(e)
    return specs, errors


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



def user_turns(name: str, item: dict[str, Any]) -> list[str]:
    """The user turns that suite `name` makes of one raw dataset item, with its exact template.

    E.g. `user_turns("gsm8k", {"question": q})` -> [q + "\\nPlease reason step by step, ..."].
    """
    return get_spec(name).render(item)
