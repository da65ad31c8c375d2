"""Benchmark suites -> `Prompt`s.

A suite is a name from `suites/*.yaml` (see `ddtree-bench suites`) or a JSONL file of
`{"id": str, "turns": [str, ...]}` (z-lab's cache format). `load_prompts` returns the prompts and a
`SuiteInfo` that baselines and run.json record (source, subset rule, template, count).
Knows nothing of models or HTTP.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ddtree_bench.errors import UsageError
from ddtree_bench.records import Prompt

SMOKE = [
    Prompt("smoke-0", ["What is 12 + 30? Answer briefly."]),
    Prompt("smoke-1", ["Write a Python function that returns the square of a number."]),
    Prompt("smoke-2", ["Name three colours.", "Now name three more."]),
]


@dataclass
class SuiteInfo:
    name: str
    source: str
    subset_rule: str | None = None     # zlab-paper | zlab-current | None (all, in file order)
    template: str | None = None
    num_prompts: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_jsonl_suite(path: Path) -> list[Prompt]:
    """Custom suite: one {"id": str, "turns": [str, ...]} per line. Errors name the line."""
    if not path.exists():
        raise UsageError(f"suite file {path} does not exist")
    prompts, seen = [], set()
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise UsageError(f"{path}:{i}: malformed JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise UsageError(f"{path}:{i}: expected an object with \"id\" and \"turns\"")
            turns = obj.get("turns")
            if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
                raise UsageError(f"{path}:{i}: \"turns\" must be a non-empty list of strings")
            pid = str(obj.get("id", i - 1))
            if pid in seen:
                raise UsageError(f"{path}:{i}: duplicate id {pid!r}")
            seen.add(pid)
            prompts.append(Prompt(pid, turns, obj.get("max_new_tokens"), {k: v for k, v in obj.items() if k not in ("id", "turns")}))
    if not prompts:
        raise UsageError(f"suite file {path} has no prompts")
    return prompts


def load_prompts(suite: str, limit: int | None = None) -> tuple[list[Prompt], SuiteInfo]:
    if suite.endswith(".jsonl") or Path(suite).is_file():
        prompts = read_jsonl_suite(Path(suite))
        info = SuiteInfo(name=Path(suite).stem, source=str(Path(suite)))
    elif suite == "smoke":
        prompts, info = list(SMOKE), SuiteInfo(name="smoke", source="built-in")
    else:
        raise UsageError(f"unknown suite {suite!r}", hint="see `ddtree-bench suites`, or pass a JSONL file of {\"id\", \"turns\"}")
    if limit is not None:
        prompts = prompts[:limit]
    info.num_prompts = len(prompts)
    return prompts, info
