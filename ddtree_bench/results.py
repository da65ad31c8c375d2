"""Results directories on disk: writing them safely, and reading them back (also from notebooks).

A run directory holds `run.json` (the full spec, versions, device, hashes, start/end),
`records.jsonl` (one `RequestRecord` per line) and `summary.json` (`metrics.summarize`).

`RunWriter` stages everything in a hidden sibling directory `.NAME.partial-HOST-PID-RANDOM/` (its
own: two writers never share one) and moves it into place only when the run finishes, so a failed
or interrupted command never leaves a half-written run where a finished one is expected, and never
leaves a `summary.json` behind. Records are appended one line per write (line-atomic), so a crash
leaves readable JSONL in the staging dir. A finished run is replaced only when asked
(`check_run_out`, `run --overwrite`). `read_run_info` refuses a run.json of another kind or of a
newer version (exit 2); every version this project wrote reads.

`load(DIR)` returns pandas DataFrames for a run or a sweep directory.
This module knows nothing of models or backends.
"""

from __future__ import annotations

import glob
import json
import os
import re
import secrets
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddtree_bench.errors import UsageError
from ddtree_bench.jsonl import iter_jsonl
from ddtree_bench.outpaths import atomic_write_text, check_output_dir, check_output_file, make_dirs, unique_sibling
from ddtree_bench.records import RequestRecord, json_safe
from ddtree_bench.text_file import parse_text_file


RUN_KIND = "ddtree-bench-run"
RUN_VERSION = 2   # run.json: 2 = records carry token_source, the spec `stream`; 1 is read the same
RESULT_DIR_MARKERS = ("run.json", "status.json")  # a directory holding one of these was written by ddtree-bench


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to `path` via a unique temporary file and rename (readers never see half a file)."""
    atomic_write_text(path, json.dumps(json_safe(obj), indent=2, ensure_ascii=False, allow_nan=False) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write text to `path` via a unique temporary file and rename (readers never see half a file)."""
    atomic_write_text(path, text)


def check_out_parent(out: Path) -> None:
    """The file `out` can be written: its nearest existing ancestor is a writable directory (UsageError otherwise)."""
    check_output_file(out)


def check_out_dir(out: Path) -> Path:
    """Validate an output directory argument before any work starts (exit 2 on a file or unwritable parent)."""
    return check_output_dir(out)


def check_run_out(out: Path, overwrite: bool = False) -> Path:
    """`run --out DIR`: a new or empty directory; one holding a finished run only with `overwrite`.

    With `overwrite` only directories ddtree-bench wrote (run.json or status.json inside) are
    replaced; anything else is refused, so a typo never deletes a user's directory."""
    out = check_output_dir(out)
    if out.is_dir() and any(out.iterdir()):
        ours = any((out / m).exists() for m in RESULT_DIR_MARKERS)
        if not ours:
            raise UsageError(f"--out {out} exists and is not a ddtree-bench results directory; refusing to replace it",
                             hint="give a new or empty directory")
        if not overwrite:
            what = "a finished run" if (out / "summary.json").exists() else "an earlier run"
            raise UsageError(f"--out {out} already holds {what}", hint="pass --overwrite to replace it, or give another --out")
    return out


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", socket.gethostname())[:32] or "host"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunWriter:
    """Stage a run directory and move it into place on `commit`.

    with RunWriter(out) as w:
        w.write_run(info); w.append(record) ...; w.commit(summary)
    Leaving the block with an exception (or without commit) removes the staging directory.
    `commit(None)` finalises without a summary.json (a run whose every request failed).

    The staging directory `.NAME.partial-HOST-PID-RANDOM` belongs to this writer alone: it never
    removes another process's staging (only those of dead processes on this host) and never
    truncates another writer's records. `overwrite` as in `check_run_out`.
    """

    def __init__(self, out: Path, overwrite: bool = False):
        self.out = check_run_out(Path(out), overwrite)
        self.overwrite = overwrite
        make_dirs(self.out.parent)
        self._clean_dead_staging()
        self.staging = self.out.parent / f".{self.out.name}.partial-{_host()}-{os.getpid()}-{secrets.token_hex(4)}"
        self.staging.mkdir()
        self._records = open(self.staging / "records.jsonl", "x", encoding="utf-8")
        self.committed = False

    def _clean_dead_staging(self) -> None:
        prefix = f".{self.out.name}.partial-{_host()}-"
        for d in self.out.parent.glob(f".{glob.escape(self.out.name)}.partial-*"):
            rest = d.name[len(prefix):] if d.name.startswith(prefix) else ""
            pid = rest.split("-", 1)[0]
            if pid.isdigit() and not _pid_alive(int(pid)):
                shutil.rmtree(d, ignore_errors=True)

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
        atomic_write_text(self.staging / name, text)

    def commit(self, summary: dict[str, Any] | None) -> Path:
        self._records.close()
        if summary is not None:
            write_json_atomic(self.staging / "summary.json", summary)
        if self.out.is_dir() and any(self.out.iterdir()) and not self.overwrite:
            # this run's results, moved to a visible name no cleanup of dead staging directories touches
            kept = self.out.with_name(f"{self.out.name}.kept-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
            os.replace(self.staging, kept)
            self.staging, self.committed = kept, True
            raise UsageError(f"--out {self.out} was filled by another process while this run ran; "
                             f"this run's results are kept in {kept}")
        old = unique_sibling(self.out, "old")
        if self.out.exists():
            os.replace(self.out, old)
        os.replace(self.staging, self.out)
        if old.exists():
            shutil.rmtree(old, ignore_errors=True)
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
        except (TypeError, ValueError) as e:
            raise UsageError(f"{path}:{i}: not a valid request record ({e})") from None
    return out


def read_json(path: Path) -> dict[str, Any]:
    """A JSON file; missing, unreadable, binary (not UTF-8) or malformed files raise UsageError."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path} does not exist")
    return parse_text_file(path, str(path), "JSON", json.loads, json.JSONDecodeError)


def check_run_info(info: Any, path: Path | str) -> dict[str, Any]:
    """A run.json's contents: refuse another kind, a version newer than RUN_VERSION, or no spec.
    Every version this project wrote (1, 2) reads the same; missing fields default."""
    if not isinstance(info, dict):
        raise UsageError(f"{path}: expected a JSON object (a ddtree-bench run.json)")
    kind = info.get("kind", RUN_KIND)
    if kind != RUN_KIND:
        raise UsageError(f"{path}: kind {kind!r} is not a ddtree-bench run ({RUN_KIND!r})")
    version = info.get("version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise UsageError(f"{path}: run.json has no valid \"version\" (got {version!r})")
    if version > RUN_VERSION:
        raise UsageError(f"{path}: run.json version {version} is newer than this ddtree-bench reads (up to {RUN_VERSION})",
                         hint="upgrade ddtree-bench")
    if not isinstance(info.get("spec", {}), dict):
        raise UsageError(f"{path}: \"spec\" must be an object")
    return info


def run_spec(info: dict[str, Any], path: Path | str) -> dict[str, Any]:
    """A checked run.json's spec, for readers that cannot go on without one (report, explain)."""
    spec = info.get("spec")
    if not isinstance(spec, dict):
        raise UsageError(f"{path}: no \"spec\" object (not a ddtree-bench run.json)")
    return spec


STAGING_RE = re.compile(r"^\..+\.partial-[^/]*$")   # RunWriter's staging name: .NAME.partial-HOST-PID-RANDOM


def refuse_staging(run_dir: Path | str) -> None:
    """A RunWriter staging directory (an interrupted or still running run: records missing, no summary) is refused
    by every reader (compare, gate, explain, report), so no verdict or chart is drawn from it."""
    run_dir = Path(run_dir)
    if STAGING_RE.match(run_dir.resolve().name):
        raise UsageError(f"{run_dir} is the staging directory of an unfinished run (interrupted, killed or still "
                         "running): its records are incomplete", hint="run it again; finished runs are moved to their --out")


def read_run_info(run_dir: Path | str) -> dict[str, Any]:
    """run.json of a run directory, checked by `check_run_info` (a staging directory refused: `refuse_staging`)."""
    refuse_staging(run_dir)
    path = Path(run_dir) / "run.json"
    return check_run_info(read_json(path), path)


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
            keys = [c for c in ("backend", "model", "draft", "dtype", "device", "method", "budget", "spec_tokens",
                                "concurrency", "request_rate", "temperature", "suite", "repeat", "status")
                    if c in summary.columns and c not in records.columns]
            records = records.merge(summary[["point_id", *keys]], on="point_id", how="left")
        return Loaded(summary, records)
    if not is_run_dir(path):
        raise UsageError(f"{path} is neither a run directory (run.json + records.jsonl) nor a sweep directory (sweep.json)")
    row = {"run": str(path)}
    if (path / "summary.json").exists():
        row.update(_flat_summary(read_json(path / "summary.json")))
    spec = read_run_info(path).get("spec", {})
    for k in ("backend", "model", "method", "budget", "suite", "temperature", "concurrency"):
        if k in spec:
            row[k] = spec[k]
    records = pd.DataFrame([r.__dict__ for r in read_records(path)])
    return Loaded(pd.DataFrame([row]), records)


def run_fact(run_info: dict[str, Any], key: str) -> Any:
    """What the run's backend says about `key` (model_hash, stop_ids, dtype, ...): the server's own
    report (`server_info`) first, then the backend description; the spec only for in-process runs
    (a client's --dtype says nothing about a server's)."""
    backend = run_info.get("backend") or {}
    info = backend.get("server_info") or {}
    if info.get(key) is not None:
        return info[key]
    if backend.get(key) is not None:
        return backend[key]
    spec = run_info.get("spec") or {}
    return spec.get(key) if spec.get("backend", "inprocess") == "inprocess" else None
