"""Results directories on disk: writing them safely, and reading them back (also from notebooks).

A run directory holds `run.json` (the full spec, versions, device, hashes, start/end),
`records.jsonl` (one `RequestRecord` per line) and `summary.json` (`metrics.summarize`).

`RunWriter` stages everything in a hidden sibling directory `.NAME.partial/` and moves it into
place only when the run finishes, so a failed or interrupted command never leaves a half-written
run where a finished one is expected, and never leaves a `summary.json` behind. Records are
appended one line per write (line-atomic), so a crash leaves readable JSONL in the staging dir.

`load(DIR)` returns pandas DataFrames for a run or a sweep directory.
This module knows nothing of models or backends.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddtree_bench.errors import UsageError
from ddtree_bench.jsonl import iter_jsonl
from ddtree_bench.records import RequestRecord, json_safe


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to `path` via a temporary file and rename (readers never see half a file)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(json_safe(obj), indent=2, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def write_text_atomic(path: Path, text: str) -> None:
    """Write text to `path` via a temporary file and rename (readers never see half a file)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def check_out_parent(out: Path) -> None:
    """Make sure the directory that will hold `out` exists and is writable (UsageError otherwise)."""
    parent = Path(out).resolve().parent
    if not parent.exists():
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"cannot create the directory of --out {out}: {e.strerror}") from None
    if not os.access(parent, os.W_OK):
        raise UsageError(f"--out {out}: directory {parent} is not writable")


def check_out_dir(out: Path) -> Path:
    """Validate an output directory argument before any work starts (exit 2 on a file or unwritable parent)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a directory")
    check_out_parent(out)
    return out


class RunWriter:
    """Stage a run directory and move it into place on `commit`.

    with RunWriter(out) as w:
        w.write_run(info); w.append(record) ...; w.commit(summary)
    Leaving the block with an exception (or without commit) removes the staging directory.
    `commit(None)` finalises without a summary.json (a run whose every request failed).
    """

    def __init__(self, out: Path):
        self.out = check_out_dir(Path(out))
        self.staging = self.out.parent / f".{self.out.name}.partial"
        if self.staging.exists():
            shutil.rmtree(self.staging)
        self.staging.mkdir(parents=True)
        self._records = open(self.staging / "records.jsonl", "w", encoding="utf-8")
        self.committed = False

    def write_run(self, info: dict[str, Any]) -> None:
        write_json_atomic(self.staging / "run.json", info)

    def update_run(self, **fields: Any) -> None:
        path = self.staging / "run.json"
        info = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        info.update(fields)
        write_json_atomic(path, info)

    def append(self, record: RequestRecord) -> None:
        self._records.write(record.to_json() + "\n")
        self._records.flush()

    def write_file(self, name: str, text: str) -> None:
        (self.staging / name).write_text(text, encoding="utf-8")

    def commit(self, summary: dict[str, Any] | None) -> Path:
        self._records.close()
        if summary is not None:
            write_json_atomic(self.staging / "summary.json", summary)
        old = self.out.parent / f".{self.out.name}.old"
        if old.exists():
            shutil.rmtree(old)
        if self.out.exists():
            os.replace(self.out, old)
        os.replace(self.staging, self.out)
        if old.exists():
            shutil.rmtree(old)
        self.committed = True
        return self.out

    def abort(self) -> None:
        if not self._records.closed:
            self._records.close()
        if self.staging.exists():
            shutil.rmtree(self.staging, ignore_errors=True)

    def __enter__(self) -> "RunWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.committed:
            self.abort()


# ---------------------------------------------------------------------------- reading


def read_records(path: Path) -> list[RequestRecord]:
    """Records of a run directory (or a records.jsonl path). Malformed lines raise UsageError with the line number."""
    path = Path(path)
    if path.is_dir():
        path = path / "records.jsonl"
    if not path.exists():
        raise UsageError(f"{path} does not exist")
    out = []
    for i, obj in iter_jsonl(path, expect="a request record (JSON object)"):
        try:
            out.append(RequestRecord.from_dict(obj))
        except TypeError as e:
            raise UsageError(f"{path}:{i}: not a valid record ({e})") from None
    return out


def read_json(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path} does not exist")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: malformed JSON ({e})") from None


def is_run_dir(path: Path) -> bool:
    return (Path(path) / "run.json").exists() and (Path(path) / "records.jsonl").exists()


def is_sweep_dir(path: Path) -> bool:
    return (Path(path) / "sweep.json").exists()


@dataclass
class Loaded:
    """DataFrames of a run or sweep: `summary` (one row per run/point), `records` (one row per request)."""

    summary: Any  # pandas.DataFrame
    records: Any  # pandas.DataFrame


def _flat_summary(summary: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for k, v in summary.items():
        if isinstance(v, dict) and k.endswith("_ms"):
            for q, x in v.items():
                row[f"{k}_{q}"] = x
        elif not isinstance(v, (dict, list)):
            row[k] = v
    return row


def load(path: str | Path) -> Loaded:
    """Load a run directory or a sweep directory into pandas DataFrames.

    For a run: `summary` has one row, `records` one row per request. For a sweep: `summary` is
    summary.csv (one row per point) and `records` concatenates every point's records with a
    `point_id` column and the point's grid settings (method, budget, concurrency, ...) and status.
    """
    import pandas as pd

    path = Path(path)
    if is_sweep_dir(path):
        csv = path / "summary.csv"
        summary = pd.read_csv(csv) if csv.exists() else pd.DataFrame()
        frames = []
        points = path / "points"
        for pdir in sorted(points.iterdir()) if points.exists() else []:
            if pdir.name.startswith("."):  # a point being written (RunWriter staging), not a result
                continue
            if (pdir / "records.jsonl").exists():
                df = pd.DataFrame([r.__dict__ for r in read_records(pdir)])
                df.insert(0, "point_id", pdir.name)
                frames.append(df)
        records = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        if len(records) and "point_id" in summary.columns:  # each request row also says which point it belongs to
            keys = [c for c in ("backend", "model", "method", "budget", "spec_tokens", "concurrency", "request_rate",
                                "temperature", "suite", "status") if c in summary.columns and c not in records.columns]
            records = records.merge(summary[["point_id", *keys]], on="point_id", how="left")
        return Loaded(summary, records)
    if not is_run_dir(path):
        raise UsageError(f"{path} is neither a run directory (run.json + records.jsonl) nor a sweep directory (sweep.json)")
    row = {"run": str(path)}
    if (path / "summary.json").exists():
        row.update(_flat_summary(read_json(path / "summary.json")))
    spec = read_json(path / "run.json").get("spec", {})
    for k in ("backend", "model", "method", "budget", "suite", "temperature", "concurrency"):
        if k in spec:
            row[k] = spec[k]
    records = pd.DataFrame([r.__dict__ for r in read_records(path)])
    return Loaded(pd.DataFrame([row]), records)
