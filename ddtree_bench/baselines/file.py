"""Greedy baselines on disk: the JSONL format, reading it back with validation, writing it safely.

Format (docs/design.md §3, a contract). Line 1 is a header object:
    {"kind": "ddtree-bench-baseline", "version": 1, "source": "record" | "import", "method",
     "temperature", "model", "draft", "model_hash", "draft_hash", "suite", "subset_rule",
     "template", "dtype", "device", "versions", "max_new_tokens", "stop_ids", "created_at", ...}
then one object per (prompt_id, turn):
    prompt_id, turn (0-based), prompt_ids, output_ids (generated tokens only, the stop token
    included when one was generated), output_text, logit_gap, accept_lengths, finish_reason.
`logit_gap[i]` is the target's top-1 minus top-2 logit at the step that produced output_ids[i]
(null for the whole entry when unknown, e.g. imported from the DDTree authors' .pt files).
`accept_lengths` are per-round acceptance lengths (root counted) of a speculative run over the
same prompt, when the baseline carries one; null otherwise. Unknown keys are kept (`extra`).

`write_baseline` writes a temporary file next to the target and renames it, so a failed command
never leaves half a baseline. Knows nothing of models, engines or runs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddtree_bench.errors import UsageError
from ddtree_bench.jsonl import iter_jsonl
from ddtree_bench.records import RequestRecord, json_safe

KIND = "ddtree-bench-baseline"
VERSION = 1
ENTRY_KEYS = ("prompt_id", "turn", "prompt_ids", "output_ids", "output_text", "logit_gap", "accept_lengths", "finish_reason")


@dataclass
class BaselineEntry:
    """One (prompt_id, turn) of a baseline."""

    prompt_id: str
    turn: int
    prompt_ids: list[int] | None
    output_ids: list[int]
    output_text: str = ""
    logit_gap: list[float | None] | None = None  # per output position; None = unknown
    accept_lengths: list[int] | None = None
    finish_reason: str | None = None              # "stop" | "length" | None (unknown)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, int]:
        return (self.prompt_id, self.turn)

    def gap_at(self, i: int) -> float | None:
        """The baseline's logit gap at output position i (None when unknown)."""
        if self.logit_gap is None or not 0 <= i < len(self.logit_gap):
            return None
        return self.logit_gap[i]

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in ENTRY_KEYS}
        d.update(self.extra)
        return d

    def as_record(self) -> RequestRecord:
        """A RequestRecord view (for metrics.py: tau, histograms), acceptance lengths only."""
        return RequestRecord(prompt_id=self.prompt_id, turn=self.turn, prompt_ids=self.prompt_ids,
                             output_ids=self.output_ids, output_text=self.output_text,
                             accept_lengths=self.accept_lengths, num_output_tokens=len(self.output_ids),
                             finish_reason=self.finish_reason)


@dataclass
class Baseline:
    header: dict[str, Any]
    entries: list[BaselineEntry]
    path: Path | None = None

    def by_key(self) -> dict[tuple[str, int], BaselineEntry]:
        return {e.key: e for e in self.entries}

    @property
    def has_gaps(self) -> bool:
        return any(e.logit_gap is not None for e in self.entries)

    @property
    def has_accept_lengths(self) -> bool:
        return any(e.accept_lengths for e in self.entries)

    @property
    def temperature(self) -> float:
        t = self.header.get("temperature")
        return float(t) if isinstance(t, (int, float)) else 0.0

    @property
    def stop_ids(self) -> list[int]:
        s = self.header.get("stop_ids")
        return [int(x) for x in s] if isinstance(s, list) else []


# ---------------------------------------------------------------------------- validation


def _int_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)


def entry_from_dict(obj: Any, where: str) -> BaselineEntry:
    """Validate one entry line; `where` ("FILE:LINE") prefixes every error."""
    if not isinstance(obj, dict):
        raise UsageError(f"{where}: expected a JSON object per line")
    pid = obj.get("prompt_id")
    if isinstance(pid, int) and not isinstance(pid, bool):
        pid = str(pid)
    if not isinstance(pid, str) or not pid:
        raise UsageError(f"{where}: \"prompt_id\" must be a non-empty string")
    turn = obj.get("turn", 0)
    if not isinstance(turn, int) or isinstance(turn, bool) or turn < 0:
        raise UsageError(f"{where}: \"turn\" must be an integer >= 0")
    out = obj.get("output_ids")
    if not _int_list(out):
        raise UsageError(f"{where}: \"output_ids\" must be a list of integers")
    prompt_ids = obj.get("prompt_ids")
    if prompt_ids is not None and not _int_list(prompt_ids):
        raise UsageError(f"{where}: \"prompt_ids\" must be a list of integers or null")
    text = obj.get("output_text", "")
    if not isinstance(text, str):
        raise UsageError(f"{where}: \"output_text\" must be a string")
    gap = obj.get("logit_gap")
    if gap is not None:
        if not isinstance(gap, list) or not all(x is None or (isinstance(x, (int, float)) and not isinstance(x, bool)) for x in gap):
            raise UsageError(f"{where}: \"logit_gap\" must be a list of numbers (or null)")
        if len(gap) != len(out):
            raise UsageError(f"{where}: \"logit_gap\" has {len(gap)} values for {len(out)} output tokens")
        gap = [None if x is None else float(x) for x in gap]
    acc = obj.get("accept_lengths")
    if acc is not None and (not _int_list(acc) or any(a < 1 for a in acc)):
        raise UsageError(f"{where}: \"accept_lengths\" must be a list of integers >= 1 (or null)")
    finish = obj.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        raise UsageError(f"{where}: \"finish_reason\" must be a string or null")
    extra = {k: v for k, v in obj.items() if k not in ENTRY_KEYS}
    return BaselineEntry(pid, turn, prompt_ids, out, text, gap, acc, finish, extra)


def read_baseline(path: str | Path) -> Baseline:
    """Read and validate a baseline file. Every problem is a UsageError naming the file and line."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"baseline {path} does not exist", hint="record one with `ddtree-bench baseline record --out FILE`")
    if path.is_dir():
        raise UsageError(f"baseline {path} is a directory; expected a .jsonl file")
    header: dict[str, Any] | None = None
    entries: list[BaselineEntry] = []
    seen: set[tuple[str, int]] = set()
    for i, obj in iter_jsonl(path):
        if header is None:
            if obj.get("kind") != KIND:
                raise UsageError(f"{path}:{i}: not a ddtree-bench baseline (line 1 must be a header with \"kind\": \"{KIND}\")")
            version = obj.get("version")
            if not isinstance(version, int) or version < 1:
                raise UsageError(f"{path}:{i}: baseline header has no valid \"version\"")
            if version > VERSION:
                raise UsageError(f"{path}: baseline format version {version} is newer than this ddtree-bench reads ({VERSION})",
                                 hint="upgrade ddtree-bench")
            header = obj
            continue
        e = entry_from_dict(obj, f"{path}:{i}")
        if e.key in seen:
            raise UsageError(f"{path}:{i}: duplicate entry for prompt {e.prompt_id!r} turn {e.turn}")
        seen.add(e.key)
        entries.append(e)
    if header is None:
        raise UsageError(f"baseline {path} is empty")
    if not entries:
        raise UsageError(f"baseline {path} has a header but no entries")
    return Baseline(header, entries, path)


# ---------------------------------------------------------------------------- writing


def check_out_file(out: str | Path) -> Path:
    """Validate an output file argument before any work starts (exit 2 on a directory or unwritable parent)."""
    from ddtree_bench.outpaths import check_output_file

    if Path(out).is_dir():
        raise UsageError(f"--out {out} is a directory; expected a file path (e.g. baselines/NAME.jsonl)")
    return check_output_file(out, "--out")


PACKAGE_DIR = Path(__file__).resolve().parent.parent   # ddtree_bench/
BUNDLED_PREFIX = "bundled:"   # a path inside the installed package, e.g. "bundled:models/toy/target"


def portable_path(value: str, cwd: Path | None = None) -> str:
    """A path as a baseline header stores it: bundled files by name ("bundled:models/toy/target"),
    files under the working directory relative to it ("suites/gsm8k.yaml"), anything else unchanged
    (a user's own model directory is theirs to name)."""
    if not isinstance(value, str) or not value.startswith("/"):
        return value
    path = Path(value)
    bases = ((PACKAGE_DIR, BUNDLED_PREFIX),   # ddtree_bench/suite_specs is a link out of the package in a checkout
             ((PACKAGE_DIR / "suite_specs").resolve(), BUNDLED_PREFIX + "suite_specs/"),
             ((cwd or Path.cwd()).resolve(), ""))
    for candidate in (Path(os.path.abspath(path)), path.resolve()):
        for base, prefix in bases:
            try:
                return prefix + candidate.relative_to(base).as_posix()
            except ValueError:
                continue
    return value


def portable_header(header: dict[str, Any], cwd: Path | None = None) -> dict[str, Any]:
    """The header without this machine's absolute paths: every string through `portable_path`,
    and the recorded command's executable by its name only. Key order is kept."""
    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return portable_path(v, cwd)

    out = walk(header)
    cmd = out.get("command")
    if isinstance(cmd, list) and cmd and isinstance(cmd[0], str):
        out["command"] = [Path(cmd[0]).name, *cmd[1:]]
    return out


def write_baseline(out: str | Path, header: dict[str, Any], entries: list[BaselineEntry]) -> Path:
    """Write header + entries to `out` atomically (a unique temporary file in the same directory,
    then rename). The header is made portable first (`portable_header`: no machine paths)."""
    from ddtree_bench.outpaths import make_dirs, unique_sibling

    out = check_out_file(out)
    head = {"kind": KIND, "version": VERSION, **{k: v for k, v in header.items() if k not in ("kind", "version")}}
    head["num_entries"] = len(entries)
    head = portable_header(head)
    make_dirs(out.parent)
    tmp = unique_sibling(out, "tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(json_safe(head), ensure_ascii=False, allow_nan=False) + "\n")
            for e in entries:
                f.write(json.dumps(json_safe(e.to_dict()), ensure_ascii=False, allow_nan=False) + "\n")
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out
