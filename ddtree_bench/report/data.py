"""Loading results for the report: run directories, sweep directories and compare JSON -> one model.

A report covers one or more RESULTS_DIRs. Each is either a run directory (`run.json`,
`records.jsonl`, `summary.json`; docs/design.md §3) or a sweep directory (`sweep.json`,
`summary.csv`, `points/<point-id>/` run directories). Everything becomes a flat list of `Point`s —
one per run or per sweep grid point — plus the compare results (`--compare FILE.json`, or a
`compare.json` found inside a run / point directory).

Numbers are never recomputed here when the files carry them: summary.json (from
`metrics.summarize`) is the source, summary.csv fills what it lacks (a sweep's `speedup_vs_ar`,
or a failed point without a directory). The one derived number is `speedup_vs_ar` for points that
have none: it comes from `metrics.speedup_vs_ar` against an AR point with the same settings (and
likewise `throughput_ratio_vs_ar`, tok/s over that AR point's). Whether a point's load was real is
summary.json's `concurrency_honoured` / `concurrency_why` (the CSV's when there is no summary).

Sweep rows are joined to `points/` directories by a `point_id` column when summary.csv has one,
else by their settings (method, budget, concurrency, request rate, temperature, suite, backend,
model). Aggregate rows (`repeat` = `all`, sweeps with repeats) become no point of their own: they
hold the intervals of a configuration over its repeats.

Configurations (`Config`): the points that differ only by their repeat, with the intervals of
`speedup_vs_ar` and output tok/s — from the sweep's aggregate row, else the single point's
`_ci_low`/`_ci_high` columns, else computed from the records with `metrics.speedup_vs_ar_interval`
(paired per repeat with the AR point of the same repeat) and `metrics.output_throughput_interval`.
A point's machine noise (load, clocks, the heavy-load flag) comes from its status.json `noise`
(noise/probe.py) or the CSV's noise columns.

Bad input (missing directory, neither a run nor a sweep, malformed JSON / JSONL / CSV) raises
`UsageError`. This module knows nothing of HTML or plotting.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddtree_bench import defaults as D
from ddtree_bench import metrics
from ddtree_bench.errors import UsageError
from ddtree_bench.stats import BOOTSTRAP, BOOTSTRAP_2WAY, STUDENT_T, Interval
from ddtree_bench.records import RequestRecord
from ddtree_bench.results import is_run_dir, is_sweep_dir, read_json, read_records

METHOD_ORDER = {"ar": 0, "dflash": 1, "ddtree": 2}
COMPARE_KINDS = ("match", "near_tie", "divergence")
# summary.csv columns that are numbers (docs/design.md §3); anything else stays a string.
CSV_NUMBERS = (
    "budget", "spec_tokens", "concurrency", "request_rate", "temperature", "acceptance_length_mean",
    "acceptance_length_token_weighted", "output_throughput_tok_s", "speedup_vs_ar", "ttft_ms_p50",
    "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99",
    "speedup_vs_ar_ci_low", "speedup_vs_ar_ci_high", "output_throughput_tok_s_ci_low", "output_throughput_tok_s_ci_high",
    "other_cpu_share", "load_avg_1m_before", "load_avg_1m_after", "cpu_mhz_before", "cpu_mhz_after", "repeats_ok",
    "throughput_ratio_vs_ar", "batch_size_mean", "batch_size_max", "gpu_sm_clock_mhz_during", "gpu_power_capped_share",
)
AGGREGATE = "all"        # summary.csv `repeat` of a configuration's row over its repeats
# (key in Point.values, summary.json path, summary.csv column)
HEADLINE = (
    ("tau_mean", ("acceptance_length_mean",), "acceptance_length_mean"),
    ("tau_token_weighted", ("acceptance_length_token_weighted",), "acceptance_length_token_weighted"),
    ("tok_s", ("output_throughput_tok_s",), "output_throughput_tok_s"),
    ("ttft_ms_p50", ("ttft_ms", "p50"), "ttft_ms_p50"),
    ("ttft_ms_p99", ("ttft_ms", "p99"), "ttft_ms_p99"),
    ("tpot_ms_p50", ("tpot_ms", "p50"), "tpot_ms_p50"),
    ("tpot_ms_p99", ("tpot_ms", "p99"), "tpot_ms_p99"),
    ("num_requests", ("num_requests",), None),
    ("num_errors", ("num_errors",), None),
    ("batch_size_mean", ("batch_size_mean",), "batch_size_mean"),
    ("batch_size_max", ("batch_size_max",), "batch_size_max"),
)


def _num(v: Any) -> float | None:
    """A finite float, or None (for '', 'nan', None, non-numbers)."""
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _int_or_none(v: Any) -> int | None:
    f = _num(v)
    return int(f) if f is not None and f == int(f) else None


@dataclass
class Point:
    """One run, or one sweep grid point: its settings, summary and (when on disk) records."""

    id: str                                  # directory name (or a label for a CSV-only row)
    path: Path | None                        # the run directory; None for a failed point without one
    source: str                              # the RESULTS_DIR it came from
    run: dict[str, Any] = field(default_factory=dict)      # run.json
    spec: dict[str, Any] = field(default_factory=dict)     # run.json "spec" (or the CSV row's settings)
    summary: dict[str, Any] | None = None                  # summary.json
    records: list[RequestRecord] | None = None
    csv_row: dict[str, Any] | None = None
    status: str = "ok"                       # ok | failed | whatever summary.csv says
    error: str | None = None
    values: dict[str, float | None] = field(default_factory=dict)  # headline numbers (see HEADLINE)
    compare: dict[str, Any] | None = None    # compare.json found in the directory
    noise: dict[str, Any] | None = None      # status.json `noise` (noise/probe.py) of a sweep point
    explain: dict[str, Any] | None = None    # explain.json (`ddtree-bench explain`) found in the directory
    correctness: dict[str, Any] | None = None  # a sweep point's correctness.json (sweep/correctness.py)
    sweep_compares: dict[str, dict[str, Any]] = field(default_factory=dict)  # "ar" / "baseline": compare_*.json
    attached_compares: list[dict[str, Any]] = field(default_factory=list)   # --compare files that are this point's

    @property
    def method(self) -> str:
        return str(self.spec.get("method") or "?")

    @property
    def budget(self) -> int | None:
        """The DDTree budget; None for AR / DFlash (their trees are not budgeted)."""
        return _int_or_none(self.spec.get("budget")) if self.method == "ddtree" else None

    @property
    def concurrency(self) -> int | None:
        return None if self.request_rate is not None else _int_or_none(self.spec.get("concurrency"))

    @property
    def request_rate(self) -> float | None:
        return _num(self.spec.get("request_rate"))

    @property
    def temperature(self) -> float:
        return _num(self.spec.get("temperature")) or 0.0

    @property
    def suite(self) -> str:
        s = self.run.get("suite")
        if isinstance(s, dict) and s.get("name"):
            return str(s["name"])
        raw = str(self.spec.get("suite") or "?")
        return Path(raw).stem if raw.endswith(".jsonl") else raw

    @property
    def repeat(self) -> int:
        """The sweep repeat index (0 for a plain run)."""
        sw = self.run.get("sweep") if isinstance(self.run.get("sweep"), dict) else {}
        pt = sw.get("point") if isinstance(sw.get("point"), dict) else {}
        r = _int_or_none(pt.get("repeat"))
        if r is None and self.csv_row is not None:
            r = _int_or_none(self.csv_row.get("repeat"))
        return r or 0

    @property
    def fault_injection(self) -> str | None:
        """The target variant a fault-injected run ran under (run or serve --target-variant), else None."""
        backend = self.run.get("backend") or {} if self.run else {}
        for v in (backend.get("target_variant"), (backend.get("server_info") or {}).get("target_variant"),
                  ((self.spec or {}).get("extra") or {}).get("target_variant")):
            if v and v != "reference":
                return str(v)
        return None

    @property
    def failed_correctness(self) -> str | None:
        """Why this point may not be ranked as fastest, else None: a fault injection, a confident divergence (vs
        the sweep's AR point, a baseline or a compare.json found with it), a failed sampling test."""
        if self.fault_injection:
            return f"fault injection (target variant {self.fault_injection})"
        for against in ("ar", "baseline"):
            j = self.judgement(against)
            if j and j.get("verdict") == "DIVERGES":
                return f"diverges from {'AR' if against == 'ar' else 'the baseline'}"
        from ddtree_bench.verdict.distribution import FALSE_ALARM_RATE

        for c in [self.compare, *self.sweep_compares.values(), *self.attached_compares]:
            if not isinstance(c, dict):
                continue
            if (c.get("num_confident_divergences") or 0) > 0:
                return "confident divergences (compare)"
            d = c.get("distribution")
            if isinstance(d, dict) and d.get("judged") and (d.get("p_value") if d.get("p_value") is not None else 1) < FALSE_ALARM_RATE:
                return "failed its sampling test (compare)"
        return None

    @property
    def heavy_load(self) -> bool | None:
        """Measured under heavy machine load (noise/probe.py's rule); None when not recorded."""
        if isinstance(self.noise, dict) and self.noise.get("heavy_load") is not None:
            return bool(self.noise["heavy_load"])
        v = (self.csv_row or {}).get("heavy_load")
        return None if v in (None, "") else str(v).lower() in ("true", "1", "yes")

    @property
    def other_cpu_share(self) -> float | None:
        if isinstance(self.noise, dict) and _num(self.noise.get("other_cpu_share")) is not None:
            return _num(self.noise["other_cpu_share"])
        return _num((self.csv_row or {}).get("other_cpu_share"))

    def gpu_during(self, key: str, column: str) -> float | None:
        """A figure of the GPUs' clocks during the point (noise.gpu_during[key], noise/gpu_clocks.py), else the
        CSV's `column`; None where no GPU was sampled."""
        during = self.noise.get("gpu_during") if isinstance(self.noise, dict) else None
        if isinstance(during, dict) and _num(during.get(key)) is not None:
            return _num(during[key])
        return _num((self.csv_row or {}).get(column))

    @property
    def gpu_power_capped_share(self) -> float | None:
        return self.gpu_during("power_capped_share", "gpu_power_capped_share")

    @property
    def gpu_sm_clock_mhz(self) -> float | None:
        return self.gpu_during("sm_clock_mhz_median", "gpu_sm_clock_mhz_during")

    @property
    def gpu_capped(self) -> bool:
        """Its GPU samples were at the power cap at least defaults.GPU_CAPPED_NOTE_SHARE of the time."""
        share = self.gpu_power_capped_share
        return share is not None and share >= D.GPU_CAPPED_NOTE_SHARE

    @property
    def concurrency_honoured(self) -> bool | None:
        """summary.json `concurrency_honoured` (metrics.concurrency_summary), else the CSV's; None = unknown."""
        v = (self.summary or {}).get("concurrency_honoured")
        if v is None:
            v = (self.csv_row or {}).get("concurrency_honoured")
        return None if v in (None, "") else str(v).lower() in ("true", "1", "yes")

    @property
    def concurrency_why(self) -> str | None:
        v = (self.summary or {}).get("concurrency_why") or (self.csv_row or {}).get("concurrency_why")
        return str(v) if v else None

    @property
    def loaded(self) -> bool:
        """Measured under load: concurrency > 1 or a request rate."""
        return self.request_rate is not None or (self.concurrency or 1) > 1

    @property
    def load_not_honoured(self) -> bool:
        """A loaded point whose backend did not run its requests at that load (it serialised them)."""
        return self.concurrency_honoured is False

    @property
    def ok(self) -> bool:
        return self.status == "ok" and (self.summary is not None or self.values.get("tok_s") is not None)

    @property
    def model(self) -> str:
        """The target as the spec names it (a bundled name or a directory)."""
        return str(self.spec.get("model") or "?")

    @property
    def model_name(self) -> str:
        """The target's short name: a directory's last part."""
        return Path(self.model).name or self.model

    @property
    def config_label(self) -> str:
        """'ar', 'dflash' or 'ddtree B=64'."""
        return f"ddtree B={self.budget}" if self.method == "ddtree" else self.method

    def judgement(self, against: str) -> dict[str, Any] | None:
        """The point's greedy verdict vs the sweep's AR point ("ar") or --baseline ("baseline"):
        correctness.json's, else the summary.csv columns (sweep/correctness.py); None when not judged."""
        j = (self.correctness or {}).get(f"vs_{against}")
        if isinstance(j, dict):
            return j
        row, sfx = self.csv_row or {}, "" if against == "ar" else "_vs_baseline"
        if row.get(f"correctness{sfx}") in (None, ""):
            return None
        return {"verdict": row[f"correctness{sfx}"], **{k: _int_or_none(_num(row.get(f"{k}{sfx}")))
                                                        for k in ("compared", "exact_match", "near_ties", "divergences", "other_diffs")}}

    @property
    def load_label(self) -> str:
        if self.request_rate is not None:
            return f"{self.request_rate:g} req/s"
        return f"c={self.concurrency}" if self.concurrency is not None else "c=?"

    @property
    def stage_ms(self) -> dict[str, float] | None:
        s = (self.summary or {}).get("stage_ms")
        return {str(k): float(v) for k, v in s.items() if _num(v) is not None} if isinstance(s, dict) and s else None

    @property
    def histogram(self) -> dict[int, float] | None:
        h = (self.summary or {}).get("acceptance_histogram")
        if not isinstance(h, dict) or not h:
            return None
        out = {}
        for k, v in h.items():
            kk, vv = _int_or_none(k), _num(v)
            if kk is not None and vv is not None:
                out[kk] = vv
        return out or None

    @property
    def rate_by_depth(self) -> list[float] | None:
        r = (self.summary or {}).get("acceptance_rate_by_depth")
        return [float(_num(x) or 0.0) for x in r] if isinstance(r, list) and r else None

    @property
    def num_rounds(self) -> int:
        return int(_num((self.summary or {}).get("num_rounds")) or 0)

    def settings_key(self) -> tuple:
        """Everything but the method/budget that must agree for two points to be compared."""
        return (self.spec.get("backend"), self.spec.get("model"), self.suite, self.temperature, self.concurrency,
                self.request_rate, _int_or_none(self.spec.get("max_new_tokens")), _int_or_none(self.spec.get("limit")))

    def sort_key(self) -> tuple:
        return (self.suite, self.temperature, self.request_rate is not None, self.request_rate or 0.0,
                self.concurrency or 0, METHOD_ORDER.get(self.method, 9), self.budget or 0, self.id)


@dataclass
class Source:
    """One RESULTS_DIR as given on the command line."""

    path: Path
    kind: str                                # "run" | "sweep"
    sweep: dict[str, Any] | None = None      # sweep.json
    points: list[Point] = field(default_factory=list)
    aggregates: list[dict[str, Any]] = field(default_factory=list)  # summary.csv rows with repeat = all


@dataclass
class Config:
    """A configuration: its points (one per repeat) and the intervals over them (module docstring)."""

    label: str                               # 'ar', 'dflash', 'ddtree B=64'
    points: list[Point]
    speedup: Interval | None = None
    tok_s: Interval | None = None
    speedup_value: float | None = None       # the estimate (also without an interval)
    tok_s_value: float | None = None

    @property
    def first(self) -> Point:
        return self.points[0]

    @property
    def method(self) -> str:
        return self.first.method

    @property
    def budget(self) -> int | None:
        return self.first.budget

    @property
    def repeats(self) -> int:
        return len(self.points)

    @property
    def heavy_points(self) -> list[Point]:
        return [p for p in self.points if p.heavy_load]

    def group_key(self) -> tuple:
        """What the takeaways compare within: target model, suite, temperature, load (backends of one model
        are ranked together; two models' speedups and tok/s are two workloads, never one ranking)."""
        p = self.first
        return (p.model, p.suite, p.temperature, p.load_label)

    def value(self, metric: str) -> float | None:
        return self.speedup_value if metric == "speedup_vs_ar" else self.tok_s_value

    def interval(self, metric: str) -> Interval | None:
        return self.speedup if metric == "speedup_vs_ar" else self.tok_s


@dataclass
class CompareResult:
    """One `compare --json` document and what it belongs to."""

    label: str
    source: str
    data: dict[str, Any]
    point: Point | None = None
    foreign: str | None = None   # why this result is not of any run in the report (shown as a warning), else None

    def output_text(self, prompt_id: Any, turn: Any) -> str | None:
        """The run's output for that prompt/turn when the records are at hand."""
        if self.point is None or not self.point.records:
            return None
        for r in self.point.records:
            if str(r.prompt_id) == str(prompt_id) and r.turn == _int_or_none(turn):
                return r.output_text
        return None


@dataclass
class ReportData:
    sources: list[Source]
    points: list[Point]
    compares: list[CompareResult]
    configs: list[Config] = field(default_factory=list)

    @property
    def ok_points(self) -> list[Point]:
        return [p for p in self.points if p.ok]

    @property
    def is_single_run(self) -> bool:
        return len(self.points) == 1


# ---------------------------------------------------------------------------- loading


def _read_json_any(path: Path) -> Any:
    try:
        return read_json(path)
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not UTF-8 text") from None


def _read_json_obj(path: Path) -> dict[str, Any]:
    obj = _read_json_any(path)
    if not isinstance(obj, dict):
        raise UsageError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _get(d: Any, keys: tuple[str, ...]) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _fill_values(p: Point) -> None:
    for key, path, col in HEADLINE:
        v = _num(_get(p.summary, path)) if p.summary is not None else None
        if v is None and col and p.csv_row is not None:
            v = _num(p.csv_row.get(col))
        p.values[key] = v
    if p.csv_row is not None:
        p.values["speedup_vs_ar"] = _num(p.csv_row.get("speedup_vs_ar"))
        p.values["throughput_ratio_vs_ar"] = _num(p.csv_row.get("throughput_ratio_vs_ar"))
    p.values.setdefault("speedup_vs_ar", None)
    p.values.setdefault("throughput_ratio_vs_ar", None)


def load_run(path: Path, source: str) -> Point:
    """A run directory -> Point (records and summary included)."""
    path = Path(path)
    from ddtree_bench.results import check_run_info, refuse_staging, run_spec

    refuse_staging(path)
    run = check_run_info(_read_json_obj(path / "run.json"), path / "run.json")
    spec = run_spec(run, path / "run.json")
    try:
        records = read_records(path)
    except (AttributeError, UnicodeDecodeError, ValueError) as e:  # a line that is JSON but not a record object
        raise UsageError(f"{path / 'records.jsonl'}: not a records file ({type(e).__name__}: {e})") from None
    summary = _read_json_obj(path / "summary.json") if (path / "summary.json").exists() else None
    p = Point(id=path.name, path=path, source=source, run=run, spec=spec, summary=summary, records=records)
    if summary is None:
        p.status = "failed"
        errs = [r.error for r in records if r.error]
        p.error = (f"{len(errs)} of {len(records)} requests failed; first: {errs[0]}" if errs
                   else "no summary.json (the run did not finish)")
    if (path / "compare.json").exists():
        p.compare = _check_compare(_read_json_obj(path / "compare.json"), path / "compare.json")
    for against in ("ar", "baseline"):  # a sweep point judged against its AR point / --baseline
        f = path / f"compare_{against}.json"
        if f.exists():
            p.sweep_compares[against] = _check_compare(_read_json_obj(f), f)
    if (path / "correctness.json").exists():
        c = _read_json_any(path / "correctness.json")
        p.correctness = c if isinstance(c, dict) else None
    if (path / "explain.json").exists():
        ex = _read_json_any(path / "explain.json")
        p.explain = ex if isinstance(ex, dict) and ex.get("kind") == "ddtree-bench-explain" else None
    if (path / "status.json").exists():
        try:
            status = _read_json_any(path / "status.json")
        except UsageError:
            status = None
        if isinstance(status, dict) and isinstance(status.get("noise"), dict):
            p.noise = status["noise"]
    _fill_values(p)
    return p


def read_summary_csv(path: Path) -> list[dict[str, Any]]:
    """summary.csv rows with numeric columns parsed; raises UsageError when it is not a CSV table."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f, strict=True)
            header = reader.fieldnames
            rows = list(reader)
    except (csv.Error, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: malformed CSV ({e})") from None
    if not header or "method" not in header:
        raise UsageError(f"{path}: malformed summary.csv (no header with a \"method\" column)")
    out = []
    for i, row in enumerate(rows, 2):
        if None in row or any(v is None for v in row.values()):
            raise UsageError(f"{path}:{i}: malformed CSV row (its field count differs from the header's)")
        clean: dict[str, Any] = {k: (v if v != "" else None) for k, v in row.items()}
        for col in CSV_NUMBERS:
            if clean.get(col) is not None:
                clean[col] = _num(clean[col]) if str(clean[col]).lower() not in ("nan", "none") else None
        out.append(clean)
    return out


def _row_matches(row: dict[str, Any], p: Point) -> bool:
    if str(row.get("method")) != p.method:
        return False
    if p.method == "ddtree" and _int_or_none(row.get("budget")) != p.budget:
        return False
    checks = (
        ("concurrency", p.concurrency if p.request_rate is None else _num(p.spec.get("concurrency"))),
        ("request_rate", p.request_rate),
        ("temperature", p.temperature),
    )
    for col, want in checks:
        if col in row and row[col] is not None and want is not None and _num(row[col]) != _num(want):
            return False
    for col, want in (("suite", {p.suite, str(p.spec.get("suite"))}), ("backend", {str(p.spec.get("backend"))}),
                      ("model", {str(p.spec.get("model"))})):
        if row.get(col) is not None and str(row[col]) not in want:
            return False
    return True


def _point_from_row(row: dict[str, Any], i: int, source: str) -> Point:
    spec = {k: row.get(k) for k in ("backend", "model", "method", "budget", "concurrency", "request_rate", "temperature", "suite")}
    pid = str(row.get("point_id") or f"summary.csv:{i + 2}")  # its line in the file
    p = Point(id=pid, path=None, source=source, spec=spec, csv_row=row,
              status=str(row.get("status") or "failed"), error=row.get("error"))
    _fill_values(p)
    return p


def load_sweep(path: Path) -> Source:
    """A sweep directory -> Source whose points are its grid points (failed points included)."""
    path = Path(path)
    sweep = _read_json_any(path / "sweep.json")
    src = Source(path=path, kind="sweep", sweep=sweep if isinstance(sweep, dict) else {"grid": sweep})
    pdir = path / "points"
    dirs = sorted(d for d in pdir.iterdir() if d.is_dir() and not d.name.startswith(".")) if pdir.is_dir() else []
    points = [load_run(d, str(path)) for d in dirs if is_run_dir(d)]
    rows = read_summary_csv(path / "summary.csv") if (path / "summary.csv").exists() else []
    by_id = {p.id: p for p in points}
    unmatched = list(points)
    for i, row in enumerate(rows):
        if str(row.get("repeat")) == AGGREGATE:
            src.aggregates.append(row)
            continue
        p = by_id.get(str(row["point_id"])) if row.get("point_id") is not None else None
        if p is None:
            p = next((q for q in unmatched if q.csv_row is None and _row_matches(row, q)), None)
        if p is None:
            points.append(_point_from_row(row, i, str(path)))
            continue
        unmatched = [q for q in unmatched if q is not p]
        p.csv_row = row
        if row.get("status") and p.summary is not None:
            p.status = str(row["status"])
        if row.get("error") and not p.error:
            p.error = str(row["error"])
        _fill_values(p)
    src.points = points
    return src


def _check_compare(obj: dict[str, Any], path: Path | str) -> dict[str, Any]:
    """Validate the `compare --json` shape (docs/design.md §3) enough to render it."""
    prompts = obj.get("prompts")
    if not isinstance(prompts, list) or not all(isinstance(x, dict) for x in prompts):
        raise UsageError(f"{path}: not a compare result (expected a \"prompts\" list of objects, as `ddtree-bench compare --json` writes)")
    kind, version = obj.get("kind", "ddtree-bench-compare"), obj.get("version", 1)
    if kind != "ddtree-bench-compare":
        raise UsageError(f"{path}: kind {kind!r} is not a compare result")
    if not isinstance(version, int) or isinstance(version, bool) or version > 1:
        raise UsageError(f"{path}: compare result version {version!r} is newer than this ddtree-bench reads (1)",
                         hint="upgrade ddtree-bench")
    return obj


def load_compare(path: Path) -> CompareResult:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--compare {path} does not exist")
    return CompareResult(label=path.name, source=str(path), data=_check_compare(_read_json_obj(path), path))


def load(paths: list[Path], compare: list[dict[str, Any]] | None = None) -> ReportData:
    """Every RESULTS_DIR -> one ReportData. `compare` are already-loaded compare documents."""
    if not paths:
        raise UsageError("no results directories given")
    sources: list[Source] = []
    seen: dict[Path, Path] = {}
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise UsageError(f"{path} does not exist")
        if path.resolve() in seen:   # the same run twice would count as two repeats of one configuration
            raise UsageError(f"{path} is given twice (also as {seen[path.resolve()]})", hint="give each run or sweep once")
        seen[path.resolve()] = path
        if not path.is_dir():
            raise UsageError(f"{path} is not a directory", hint="pass a run directory (run.json + records.jsonl) or a sweep directory (sweep.json)")
        if is_sweep_dir(path):
            sources.append(load_sweep(path))
        elif is_run_dir(path):
            sources.append(Source(path=path, kind="run", points=[load_run(path, str(path))]))
        else:
            raise UsageError(f"{path} is neither a run directory (run.json + records.jsonl) nor a sweep directory (sweep.json)")
    points = sorted((p for s in sources for p in s.points), key=Point.sort_key)
    _fill_speedups(points)
    configs = build_configs(points, [row for s in sources for row in s.aggregates])
    compares = [CompareResult(label=f"{p.id}/compare.json", source=str(p.path / "compare.json"), data=p.compare, point=p)
                for p in points if p.compare is not None and p.path is not None]
    for i, c in enumerate(compare or []):
        if isinstance(c, CompareResult):
            compares.append(c)
        else:
            compares.append(CompareResult(label=f"compare #{i + 1}", source="(given)", data=_check_compare(c, f"compare #{i + 1}")))
    for c in compares:
        if c.point is None:
            _own_point(c, points)
            if c.point is not None:
                c.point.attached_compares.append(c.data)
    return ReportData(sources=sources, points=points, compares=compares, configs=configs)


def _own_point(c: CompareResult, points: list[Point]) -> None:
    """The report's point a given compare result is of (its `run`: the same directory, else the same directory
    name), or `foreign` saying it is of none, so a page never shows another run's correctness as its own."""
    run = c.data.get("run")
    if not isinstance(run, str) or not run:
        c.foreign = "this compare result does not name its run; it may not be of this report's runs"
        return
    dirs = [p for p in points if p.path is not None]
    try:
        same = [p for p in dirs if p.path.resolve() == Path(run).resolve()]
    except OSError:
        same = []
    same = same or [p for p in dirs if p.path.name == Path(run).name]
    if len(same) == 1:
        c.point = same[0]
    elif not same:
        c.foreign = f"this compare result is of run {run}, which is not among this report's inputs"


def _fill_speedups(points: list[Point]) -> None:
    """speedup_vs_ar from `metrics.speedup_vs_ar`, and throughput_ratio_vs_ar from
    `metrics.throughput_ratio_vs_ar`, for points that lack them and have an AR partner."""
    ar = {}
    for p in points:
        if p.method == "ar" and p.records and p.summary is not None:
            ar.setdefault((p.settings_key(), p.repeat), p)
    for p in points:
        if p.values.get("speedup_vs_ar") is not None or not p.records or p.summary is None:
            continue
        partner = ar.get((p.settings_key(), p.repeat))
        if partner is not None:
            p.values["speedup_vs_ar"] = 1.0 if partner is p else metrics.speedup_vs_ar(p.records, partner.records)
    for p in points:  # the batched speedup: tok/s over AR's at the same settings and load
        partner = ar.get((p.settings_key(), p.repeat))
        if p.values.get("throughput_ratio_vs_ar") is None and partner is not None:
            p.values["throughput_ratio_vs_ar"] = metrics.throughput_ratio_vs_ar(p.values.get("tok_s"), partner.values.get("tok_s"))


# ---------------------------------------------------------------------------- configurations


def _csv_interval(row: dict[str, Any] | None, name: str, method: str, n: int) -> Interval | None:
    if row is None:
        return None
    est, lo, hi = _num(row.get(name)), _num(row.get(f"{name}_ci_low")), _num(row.get(f"{name}_ci_high"))
    if est is None or lo is None or hi is None:
        return None
    from ddtree_bench import defaults as D

    return Interval(est, lo, hi, D.CI_LEVEL, method, n)


def _aggregate_for(p: Point, aggregates: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The sweep's aggregate row of p's configuration: matched by point id (`<repeat-0 id>-all`), else by settings."""
    for row in aggregates:
        if p.repeat == 0 and str(row.get("point_id")) == f"{p.id}-{AGGREGATE}":
            return row
    return next((row for row in aggregates if _row_matches(row, p)), None)


def build_configs(points: list[Point], aggregates: list[dict[str, Any]]) -> list[Config]:
    """The ok points grouped into configurations (repeats of one setting), with their intervals."""
    groups: dict[tuple, list[Point]] = {}
    for p in points:
        if p.ok:
            groups.setdefault((p.source, p.settings_key(), p.method, p.budget, str(p.spec.get("spec_tokens"))), []).append(p)
    ars: dict[tuple, Point] = {}
    for p in points:
        if p.ok and p.method == "ar" and p.records:
            ars.setdefault((p.source, p.settings_key(), p.repeat), p)
    out = []
    for key, pts in groups.items():
        pts = sorted(pts, key=lambda q: q.repeat)
        c = Config(pts[0].config_label, pts)
        agg = _aggregate_for(pts[0], aggregates) if len(pts) > 1 else None
        if agg is not None:
            n = int(_num(agg.get("repeats_ok")) or len(pts))
            c.speedup = _csv_interval(agg, "speedup_vs_ar", BOOTSTRAP_2WAY, n)
            c.tok_s = _csv_interval(agg, "output_throughput_tok_s", STUDENT_T, n)
            c.speedup_value, c.tok_s_value = _num(agg.get("speedup_vs_ar")), _num(agg.get("output_throughput_tok_s"))
        elif len(pts) == 1 and _csv_interval(pts[0].csv_row, "speedup_vs_ar", BOOTSTRAP, 1) is not None:
            c.speedup = _csv_interval(pts[0].csv_row, "speedup_vs_ar", BOOTSTRAP, 1)
        elif all(q.records for q in pts):
            mine, theirs = [], []
            for q in pts:
                a = ars.get((q.source, q.settings_key(), q.repeat))
                if a is not None:
                    mine.append(q.records), theirs.append(a.records)
            c.speedup = metrics.speedup_vs_ar_interval(mine, theirs) if mine else None
            c.tok_s = metrics.output_throughput_interval([q.records for q in pts])
        if c.speedup_value is None:
            vals = [v for q in pts if (v := q.values.get("speedup_vs_ar")) is not None]
            c.speedup_value = c.speedup.estimate if c.speedup else (sum(vals) / len(vals) if vals else None)
        if c.tok_s_value is None:
            vals = [v for q in pts if (v := q.values.get("tok_s")) is not None]
            c.tok_s_value = c.tok_s.estimate if c.tok_s else (sum(vals) / len(vals) if vals else None)
        out.append(c)
    disambiguate(out)
    return out


def disambiguate(configs: list[Config]) -> None:
    """Configurations of one load level that share a label ('ddtree B=32' of an in-process run and of a
    standalone one) get what tells them apart: the backend, else the model, else the run (source)."""
    groups: dict[tuple, list[Config]] = {}
    for c in configs:
        groups.setdefault((c.group_key(), c.label), []).append(c)
    for cs in groups.values():
        if len(cs) < 2:
            continue
        parts: list[list[str]] = [[] for _ in cs]
        for get in (lambda c: c.first.spec.get("backend"), lambda c: Path(str(c.first.spec.get("model"))).name,
                    lambda c: Path(c.first.source).name, lambda c: c.first.id):
            tags = [str(get(c)) for c in cs]
            if len(set(tags)) > 1:
                for ps, t in zip(parts, tags):
                    ps.append(t)
            if len({tuple(ps) for ps in parts}) == len(cs):
                break
        for c, ps in zip(cs, parts):
            if ps:
                c.label = f"{c.label} ({', '.join(ps)})"
