"""Reading JSON Lines files whose every problem is reported as `FILE:LINE: what is wrong`.

Suites, baselines and records all read JSONL written by people or other tools; this is the one
place that turns a malformed line into a `UsageError` naming the file and the 1-based line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ddtree_bench.errors import UsageError


def iter_jsonl(path: Path, expect: str = "a JSON object") -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, object) for every non-blank line; a line that is not valid JSON, or not a
    JSON object, raises UsageError("{path}:{line}: ..."); so do bytes that are not UTF-8 (a binary
    file), JSON nested beyond Python's recursion limit, and a path that cannot be read. A UTF-8
    byte-order mark opening the file is dropped."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise UsageError(f"{path}: cannot read ({e.strerror or e})") from None
    with f:
        for i, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if i == 1 else "utf-8")   # a byte-order mark some editors write: dropped
            except UnicodeDecodeError as e:
                raise UsageError(f"{path}:{i}: not UTF-8 text (a binary file?) at byte {e.start} of the line") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise UsageError(f"{path}:{i}: malformed JSON ({e.msg})") from None
            except RecursionError:
                raise UsageError(f"{path}:{i}: JSON nested too deeply") from None
            if not isinstance(obj, dict):
                raise UsageError(f"{path}:{i}: expected {expect}, got {type(obj).__name__}")
            yield i, obj
