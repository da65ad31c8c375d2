"""The sweep directory on disk, and the one-row-per-point `summary.csv`.

    results/<sweep-id>/
      sweep.json                 the grid, the expanded points (in execution order), versions, start time
      summary.csv                one row per attempted point: SUMMARY_COLUMNS (the design.md contract),
                                 then EXTRA_COLUMNS (intervals and noise: sweep/aggregate.py; greedy
                                 correctness vs AR and --baseline: sweep/correctness.py); with
                                 repeats > 1 also one aggregate row per point (`repeat` = `all`)
      summary.json               the same rows, the interval method and the takeaways (aggregate.py)
      points/<point-id>/         a run directory (run.json, records.jsonl, summary.json), plus
                                 status.json (ok | failed, error, server log tail), and for server
                                 backends server.log (the server's log while this point ran),
                                 server.json (command, version, url) and counters.json; after the
                                 sweep correctness.json and compare_ar.json / compare_baseline.json
      servers/<server-id>-<n>.log  each server process's whole log (n counts restarts)

A point is finished iff its `summary.json` exists; everything else (failed, interrupted, never
started) runs again under `--resume`, and its directory is replaced as a whole. Rows are appended
to summary.csv with one `write` on an O_APPEND descriptor (line-atomic); at the start and the end of
every invocation the file is rewritten atomically from the point directories, so it never holds a
point twice once the command returns.

Knows the files; nothing of servers or engines (metrics come from `metrics.py`).
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

from ddtree_bench import metrics
from ddtree_bench.errors import UsageError
from ddtree_bench.results import read_json, read_records, write_json_atomic
from ddtree_bench.sweep.aggregate import CI_COLUMNS, NOISE_COLUMNS, noise_columns, speedup_columns
from ddtree_bench.sweep.correctness import CORRECTNESS_COLUMNS, CORRECTNESS_JSON
from ddtree_bench.sweep.correctness import columns as correctness_columns
from ddtree_bench.sweep.grid import Point, ar_index  # noqa: F401 (ar_index: also read from here)

SUMMARY_COLUMNS = (
    "backend", "model", "method", "budget", "spec_tokens", "concurrency", "request_rate", "temperature", "suite",
    "status", "error", "acceptance_length_mean", "acceptance_length_token_weighted", "output_throughput_tok_s",
    "speedup_vs_ar", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99",
)
EXTRA_COLUMNS = (
    "point_id", "draft", "dtype", "device", "repeat", "num_requests", "num_errors", "total_output_tokens",
    "duration_s", "e2e_ms_p50", "itl_ms_p50", "server_acceptance_length", "acceptance_crosscheck_rel_diff",
    "acceptance_crosscheck_agree", "server_version",
    # batching (metrics.concurrency_summary): total tok/s vs AR at the same concurrency, whether the load was real
    "throughput_ratio_vs_ar", "concurrency_honoured", "concurrency_why", "batch_size_mean", "batch_size_max",
) + CI_COLUMNS + NOISE_COLUMNS + CORRECTNESS_COLUMNS  # greedy outputs vs AR / --baseline (sweep/correctness.py)
COLUMNS = SUMMARY_COLUMNS + EXTRA_COLUMNS
ERROR_CHARS = 300
SWEEP_VERSION = 2   # sweep.json; 2 adds `schedule` (the run order) and grid `order` / `order_seed`


class SweepDir:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.sweep_json = self.root / "sweep.json"
        self.summary_csv = self.root / "summary.csv"
        self.points_dir = self.root / "points"
        self.servers_dir = self.root / "servers"

    @property
    def id(self) -> str:
        return self.root.name

    def point_dir(self, pid: str) -> Path:
        return self.points_dir / pid

    def finished(self, pid: str) -> bool:
        """The point's results are whole: run.json, records.jsonl and summary.json all there (a point missing
        one - a crash between writes, a hand deletion - runs again on --resume rather than pass unjudged)."""
        d = self.point_dir(pid)
        return all((d / name).is_file() for name in ("summary.json", "run.json", "records.jsonl"))

    # ------------------------------------------------------------------ sweep.json

    def create(self, info: dict[str, Any]) -> None:
        self.points_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.sweep_json, info)

    def read(self) -> dict[str, Any]:
        if not self.sweep_json.exists():
            raise UsageError(f"{self.root} is not a sweep directory (no sweep.json)")
        info = read_json(self.sweep_json)
        if info.get("kind") != "ddtree-bench-sweep" or not isinstance(info.get("points"), list):
            raise UsageError(f"{self.sweep_json}: not a ddtree-bench sweep file")
        if not isinstance(info.get("version", 1), int) or info.get("version", 1) > SWEEP_VERSION:
            raise UsageError(f"{self.sweep_json}: sweep version {info.get('version')!r} is newer than this ddtree-bench "
                             f"reads (up to {SWEEP_VERSION})", hint="upgrade ddtree-bench")
        return info

    def update(self, **fields: Any) -> None:
        info = read_json(self.sweep_json)
        info.update(fields)
        write_json_atomic(self.sweep_json, info)

    # ------------------------------------------------------------------ per-point files

    def write_point_json(self, pid: str, name: str, obj: Any) -> None:
        d = self.point_dir(pid)
        d.mkdir(parents=True, exist_ok=True)
        write_json_atomic(d / name, obj)

    def read_point_json(self, pid: str, name: str) -> dict[str, Any] | None:
        path = self.point_dir(pid) / name
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return None

    def mark_failed(self, pid: str, error: str, log_tail: str | None = None, **extra: Any) -> None:
        """Record a failed point: no summary.json (removed first, so a crash in between means 'rerun')."""
        d = self.point_dir(pid)
        d.mkdir(parents=True, exist_ok=True)
        (d / "summary.json").unlink(missing_ok=True)
        self.write_point_json(pid, "status.json", {"status": "failed", "error": error, "log_tail": log_tail, **extra})

    def mark_unsupported(self, pid: str, why: str) -> None:
        """A point this installation cannot serve (e.g. DDTree on a vLLM release): recorded, not run, not
        failed; `--resume` probes again (a PR build may have been installed since)."""
        d = self.point_dir(pid)
        d.mkdir(parents=True, exist_ok=True)
        (d / "summary.json").unlink(missing_ok=True)
        self.write_point_json(pid, "status.json", {"status": "unsupported", "error": why})

    # ------------------------------------------------------------------ summary.csv

    def append_row(self, row: dict[str, Any]) -> None:
        """One line, one write(2) on an O_APPEND descriptor: concurrent readers never see half a row."""
        new = not self.summary_csv.exists() or self.summary_csv.stat().st_size == 0
        data = (_csv_line(COLUMNS) if new else "") + _csv_line([_cell(row.get(c)) for c in COLUMNS])
        fd = os.open(self.summary_csv, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data.encode("utf-8"))
        finally:
            os.close(fd)

    def rewrite_csv(self, rows: list[dict[str, Any]]) -> None:
        text = _csv_line(COLUMNS) + "".join(_csv_line([_cell(r.get(c)) for c in COLUMNS]) for r in rows)
        tmp = self.summary_csv.with_name(f".{self.summary_csv.name}.tmp-{os.getpid()}")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, self.summary_csv)

    # ------------------------------------------------------------------ rows

    def row(self, p: Point, ar: Point | None) -> dict[str, Any] | None:
        """The summary row of an attempted point (None if never attempted), from its directory."""
        pid = p.id
        summary = self.read_point_json(pid, "summary.json")
        status = self.read_point_json(pid, "status.json") or {}
        if summary is None and status.get("status") not in ("failed", "unsupported"):
            return None
        counters = self.read_point_json(pid, "counters.json") or {}
        cross = counters.get("crosscheck") or {}
        row: dict[str, Any] = {
            "backend": p.backend, "model": p.model, "method": p.method, "budget": p.budget,
            "spec_tokens": status.get("spec_tokens", p.spec_tokens), "concurrency": p.concurrency,
            "request_rate": p.request_rate, "temperature": p.temperature, "suite": p.suite,
            "status": "ok" if summary is not None else ("unsupported" if status.get("status") == "unsupported" else "failed"),
            "error": status.get("error") if summary is None else None,
            "point_id": pid, "draft": p.draft, "dtype": p.dtype, "device": p.device, "repeat": p.repeat,
            "server_acceptance_length": cross.get("server_acceptance_length"),
            "acceptance_crosscheck_rel_diff": cross.get("rel_diff"), "acceptance_crosscheck_agree": cross.get("agree"),
            "server_version": status.get("server_version"),
        }
        row.update(noise_columns(status.get("noise")))
        if summary is not None:
            row.update({k: summary.get(k) for k in ("acceptance_length_mean", "acceptance_length_token_weighted",
                                                     "output_throughput_tok_s", "num_requests", "num_errors",
                                                     "total_output_tokens", "duration_s")})
            for dist, qs in (("ttft_ms", ("p50", "p99")), ("tpot_ms", ("p50", "p99")), ("e2e_ms", ("p50",)), ("itl_ms", ("p50",))):
                for q in qs:
                    row[f"{dist}_{q}"] = (summary.get(dist) or {}).get(q)
            if summary.get("num_errors") and summary.get("error_kinds"):
                row["error"] = "request errors: " + "; ".join(f"{k} x{n}" for k, n in summary["error_kinds"].items())
            row["speedup_vs_ar"] = self.speedup(p, ar)
            row.update({k: summary.get(k) for k in ("concurrency_honoured", "concurrency_why", "batch_size_mean", "batch_size_max")})
            ar_summary = self.read_point_json(ar.id, "summary.json") if ar is not None else None
            row["throughput_ratio_vs_ar"] = metrics.throughput_ratio_vs_ar(
                summary.get("output_throughput_tok_s"), (ar_summary or {}).get("output_throughput_tok_s"))
            row.update(speedup_columns(self, p, ar))
            row.update(correctness_columns(self.read_point_json(pid, CORRECTNESS_JSON)))
        return row

    def speedup(self, p: Point, ar: Point | None) -> float | None:
        """`metrics.speedup_vs_ar` against the paired AR point's records (None until both finished)."""
        if ar is None or not (self.finished(p.id) and self.finished(ar.id)):
            return None
        try:
            return metrics.speedup_vs_ar(read_records(self.point_dir(p.id)), read_records(self.point_dir(ar.id)))
        except UsageError:
            return None

    def rows(self, points: list[Point]) -> list[dict[str, Any]]:
        ars = ar_index(points)
        out = []
        for p in points:
            r = self.row(p, ars.get(p.ar_key()))
            if r is not None:
                out.append(r)
        return out


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v) if v == v else ""
    s = str(v)
    if "\n" in s or len(s) > ERROR_CHARS:
        s = " ".join(s.split())[:ERROR_CHARS]
    return s


def _csv_line(cells: Any) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(list(cells))
    return buf.getvalue()
