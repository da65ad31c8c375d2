"""Intervals, noise columns and takeaways of a sweep: the `_ci_low`/`_ci_high` columns, one aggregate
row per point over its repeats, the sweep's summary.json, and the verdict on the fastest point.

Per repeat (one row each in summary.csv): `speedup_vs_ar_ci_low/high` — the percentile bootstrap
over that repeat's paired prompts (`metrics.speedup_vs_ar_interval`); tok/s has no interval from
one repeat. The noise columns come from the point's status.json `noise` (`noise.probe`).

Aggregate (`repeat` = `all`, only when the grid has repeats > 1; `point_id` = the repeat-0 point's
id + `-all`): `speedup_vs_ar` pooled over repeats with the two-way bootstrap over repeats and
prompts (repeat r of the method pairs with repeat r of AR), `output_throughput_tok_s` = the mean
over repeats with the Student t interval (`metrics.output_throughput_interval`); τ, TTFT, TPOT,
E2E, ITL from the pooled records of the finished repeats; counts summed; `heavy_load` true when any
repeat ran under heavy load; `gpu_power_capped_share` the largest and `gpu_sm_clock_mhz_during` the lowest over
repeats. Status `ok` when every repeat finished, else `failed` with the count.

summary.json (kind `ddtree-bench-sweep-summary`, version 2; 1 had no correctness): the interval
method and defaults, the correctness verdict (`correctness`: sweep/correctness.py's closing lines),
every row (per repeat and aggregate) and the takeaways (`noise.verdict`), one per group of
settings that share an AR baseline, except groups in which some point did not honour its
concurrency (`concurrency_honoured` false): those are listed under `no_takeaway` with the why.
Aggregate rows carry the batching columns too: honoured only when every repeat was,
batch_size_mean / max over repeats, and throughput_ratio_vs_ar = the row's mean tok/s / the AR
aggregate row's at the same settings.

Knows the sweep's rows and point directories (through the `SweepDir` it is given); nothing of
servers or engines.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ddtree_bench import defaults as D
from ddtree_bench import metrics
from ddtree_bench.errors import UsageError
from ddtree_bench.noise.verdict import Candidate, Verdict, decide, sentence
from ddtree_bench.records import RequestRecord
from ddtree_bench.stats import BOOTSTRAP, BOOTSTRAP_2WAY, STUDENT_T, Interval
from ddtree_bench.sweep.grid import Point, config_label  # noqa: F401 (config_label: also read from here)

SUMMARY_KIND = "ddtree-bench-sweep-summary"
SUMMARY_VERSION = 2  # 2: rows carry the correctness columns and the document a `correctness` block
ALL = "all"
CI_COLUMNS = ("speedup_vs_ar_ci_low", "speedup_vs_ar_ci_high", "output_throughput_tok_s_ci_low",
              "output_throughput_tok_s_ci_high")
NOISE_COLUMNS = ("repeats_ok", "heavy_load", "other_cpu_share", "load_avg_1m_before", "load_avg_1m_after",
                 "cpu_mhz_before", "cpu_mhz_after", "gpu_util_pct_before", "gpu_sm_clock_mhz_before",
                 "gpu_sm_clock_mhz_during", "gpu_power_capped_share")


def interval_method() -> dict[str, Any]:
    """What every interval in the sweep's files means (recorded in summary.json)."""
    return {"level": D.CI_LEVEL, "resamples": D.CI_RESAMPLES, "seed": D.CI_SEED,
            "speedup_vs_ar": f"{BOOTSTRAP} over paired prompts (one repeat); {BOOTSTRAP_2WAY} (aggregate rows)",
            "output_throughput_tok_s": f"{STUDENT_T} (aggregate rows, >= 2 repeats)",
            "repeats_to_separate": "n' = ceil(n * ((h_best + h_next) / (est_best - est_next))^2)",
            "heavy_load": f"defaults.HEAVY_OTHER_CORES_SHARE = {D.HEAVY_OTHER_CORES_SHARE}, "
                          f"HEAVY_LOAD_PER_CORE = {D.HEAVY_LOAD_PER_CORE}"}


def _ci(iv: Interval | None, name: str) -> dict[str, Any]:
    return {f"{name}_ci_low": iv.low if iv else None, f"{name}_ci_high": iv.high if iv else None}


def _records(sdir, p: Point) -> list[RequestRecord] | None:
    if not sdir.finished(p.id):
        return None
    try:
        from ddtree_bench.results import read_records

        return read_records(sdir.point_dir(p.id))
    except UsageError:
        return None


def speedup_columns(sdir, p: Point, ar: Point | None) -> dict[str, Any]:
    """The per-repeat row's speedup interval (bootstrap over the repeat's paired prompts)."""
    mine = _records(sdir, p)
    base = _records(sdir, ar) if ar is not None else None
    iv = metrics.speedup_vs_ar_interval([mine], [base]) if mine and base else None
    return _ci(iv, "speedup_vs_ar")


def noise_columns(noise: dict[str, Any] | None) -> dict[str, Any]:
    """status.json `noise` (noise.probe.describe) -> the summary.csv noise columns."""
    if not isinstance(noise, dict):
        return {}
    b, a, during = noise.get("before") or {}, noise.get("after") or {}, noise.get("gpu_during") or {}
    gpus = b.get("gpus") or []
    utils = [g.get("utilization_pct") for g in gpus if g.get("utilization_pct") is not None]
    clocks = [g.get("sm_clock_mhz") for g in gpus if g.get("sm_clock_mhz") is not None]
    return {"heavy_load": noise.get("heavy_load"), "other_cpu_share": noise.get("other_cpu_share"),
            "load_avg_1m_before": b.get("load_avg_1m"), "load_avg_1m_after": a.get("load_avg_1m"),
            "cpu_mhz_before": b.get("cpu_mhz_mean"), "cpu_mhz_after": a.get("cpu_mhz_mean"),
            "gpu_util_pct_before": max(utils) if utils else None,
            "gpu_sm_clock_mhz_before": min(clocks) if clocks else None,
            "gpu_sm_clock_mhz_during": during.get("sm_clock_mhz_median"),
            "gpu_power_capped_share": during.get("power_capped_share")}


# ---------------------------------------------------------------------------- aggregate rows


def base_point(p: Point) -> Point:
    """The point with its repeat index dropped: what the repeats of one configuration share."""
    return dataclasses.replace(p, repeat=0)


def aggregate_id(p: Point) -> str:
    return f"{base_point(p).id}-{ALL}"


def _pooled(records: Sequence[RequestRecord]) -> dict[str, Any]:
    s = metrics.summarize(records)
    out = {"acceptance_length_mean": s["acceptance_length_mean"],
           "acceptance_length_token_weighted": s["acceptance_length_token_weighted"],
           "num_requests": s["num_requests"], "num_errors": s["num_errors"], "total_output_tokens": s["total_output_tokens"]}
    for dist, qs in (("ttft_ms", ("p50", "p99")), ("tpot_ms", ("p50", "p99")), ("e2e_ms", ("p50",)), ("itl_ms", ("p50",))):
        for q in qs:
            out[f"{dist}_{q}"] = (s.get(dist) or {}).get(q)
    return out


def aggregate_rows(sdir, points: list[Point], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One `repeat` = `all` row per configuration with repeats > 1 (module docstring), in point order."""
    by_id = {r["point_id"]: r for r in rows}
    groups: dict[Point, list[Point]] = {}
    for p in points:
        groups.setdefault(base_point(p), []).append(p)
    ars = {base_point(p).ar_key(): [q for q in groups[base_point(p)]] for p in points if p.method == "ar"}
    out = []
    for base, reps in groups.items():
        if len(reps) < 2:
            continue
        rep_rows = [by_id.get(p.id) for p in reps]
        ok = [p for p, r in zip(reps, rep_rows) if r is not None and r.get("status") == "ok"]
        first = next((r for r in rep_rows if r is not None), None)
        if first is None:
            continue
        row = {k: first.get(k) for k in ("backend", "model", "method", "budget", "spec_tokens", "concurrency",
                                          "request_rate", "temperature", "suite", "draft", "dtype", "device",
                                          "server_version")}
        row.update(point_id=aggregate_id(base), repeat=ALL, repeats_ok=len(ok),
                   status="ok" if len(ok) == len(reps) else "failed",
                   error=None if len(ok) == len(reps) else f"{len(reps) - len(ok)} of {len(reps)} repeats did not finish")
        recs = {p.id: _records(sdir, p) for p in ok}
        recs = {k: v for k, v in recs.items() if v}
        if recs:
            row.update(_pooled([r for v in recs.values() for r in v]))
            row["duration_s"] = sum(float(by_id[k].get("duration_s") or 0.0) for k in recs)
            tps = metrics.output_throughput_interval([recs[p.id] for p in ok if p.id in recs])
            vals = [metrics.output_throughput_tok_s(v) for v in recs.values()]
            vals = [v for v in vals if v is not None]
            row["output_throughput_tok_s"] = tps.estimate if tps else (sum(vals) / len(vals) if vals else None)
            row.update(_ci(tps, "output_throughput_tok_s"))
            ar_reps = {q.repeat: q for q in ars.get(base.ar_key(), [])}
            mine, theirs = [], []
            for p in ok:
                a = ar_reps.get(p.repeat)
                ar_recs = _records(sdir, a) if a is not None else None
                if p.id in recs and ar_recs:
                    mine.append(recs[p.id]), theirs.append(ar_recs)
            sp = metrics.speedup_vs_ar_interval(mine, theirs) if mine else None
            row["speedup_vs_ar"] = sp.estimate if sp else None
            row.update(_ci(sp, "speedup_vs_ar"))
        heavy = [r.get("heavy_load") for r in rep_rows if r is not None and r.get("heavy_load") is not None]
        row["heavy_load"] = any(heavy) if heavy else None
        shares = [r.get("other_cpu_share") for r in rep_rows if r is not None and r.get("other_cpu_share") is not None]
        row["other_cpu_share"] = max(shares) if shares else None
        capped = [r["gpu_power_capped_share"] for r in rep_rows if r is not None and r.get("gpu_power_capped_share") is not None]
        row["gpu_power_capped_share"] = max(capped) if capped else None
        mhz = [r["gpu_sm_clock_mhz_during"] for r in rep_rows if r is not None and r.get("gpu_sm_clock_mhz_during") is not None]
        row["gpu_sm_clock_mhz_during"] = min(mhz) if mhz else None
        row.update(_batching([r for r in rep_rows if r is not None and r.get("status") == "ok"]))
        row.update(_correctness([r for r in rep_rows if r is not None and r.get("status") == "ok"]))
        row["_ar_key"] = base.ar_key()
        out.append(row)
    ar_rows = {r["_ar_key"]: r for r in out if r.get("method") == "ar"}
    for r in out:
        ar = ar_rows.get(r.pop("_ar_key"))
        r["throughput_ratio_vs_ar"] = metrics.throughput_ratio_vs_ar(
            r.get("output_throughput_tok_s"), ar.get("output_throughput_tok_s") if ar is not None else None)
    return out


def _batching(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """The aggregate row's batching columns: honoured only if every repeat was (False if any was not,
    with the first repeat's why), batch_size_mean the mean and batch_size_max the max over repeats."""
    flags = [r.get("concurrency_honoured") for r in reps]
    honoured = False if any(str(f) == "False" for f in flags) else (True if flags and all(str(f) == "True" for f in flags) else None)
    why = next((r.get("concurrency_why") for r in reps if str(r.get("concurrency_honoured")) == "False"), None)
    means = [float(r["batch_size_mean"]) for r in reps if r.get("batch_size_mean") not in (None, "")]
    maxes = [int(float(r["batch_size_max"])) for r in reps if r.get("batch_size_max") not in (None, "")]
    return {"concurrency_honoured": honoured, "concurrency_why": why,
            "batch_size_mean": sum(means) / len(means) if means else None, "batch_size_max": max(maxes) if maxes else None}


def _correctness(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """The aggregate row's correctness columns: counts summed over repeats, the worst verdict
    (DIVERGES > unjudged > near ties > lossless; any other verdict is kept as it is)."""
    from ddtree_bench.sweep.correctness import COUNTS

    out: dict[str, Any] = {}
    rank = {"DIVERGES": 0, "unjudged": 1, "no reference": 2, "not judged": 3, "near ties": 4, "lossless": 5}
    for suffix in ("", "_vs_baseline"):
        verdicts = [str(r[f"correctness{suffix}"]) for r in reps if r.get(f"correctness{suffix}") not in (None, "")]
        if not verdicts:
            continue
        out[f"correctness{suffix}"] = min(verdicts, key=lambda v: rank.get(v, -1))
        for k in COUNTS:
            out[f"{k}{suffix}"] = sum(int(float(r.get(f"{k}{suffix}") or 0)) for r in reps)
    return out


# ---------------------------------------------------------------------------- takeaways


def _settings(row: dict[str, Any]) -> tuple:
    return tuple(str(row.get(k)) for k in ("backend", "model", "dtype", "device", "suite", "concurrency",
                                           "request_rate", "temperature"))


def _settings_label(row: dict[str, Any], varying: list[str]) -> str:
    parts = []
    for k in varying:
        v = row.get(k)
        if k == "model":
            v = Path(str(v)).name
        elif k == "concurrency":
            v = f"c={v}" if row.get("request_rate") in (None, "") else None
        elif k == "request_rate":
            v = f"{v} req/s" if v not in (None, "") else None
        elif k == "temperature":
            v = f"T={v}"
        if v not in (None, ""):
            parts.append(str(v))
    return ", ".join(parts)


def _interval(row: dict[str, Any], name: str, method: str, n: int) -> Interval | None:
    lo, hi, est = row.get(f"{name}_ci_low"), row.get(f"{name}_ci_high"), row.get(name)
    if lo in (None, "") or hi in (None, "") or est in (None, ""):
        return None
    return Interval(float(est), float(lo), float(hi), D.CI_LEVEL, method, n)


def takeaways(rows: list[dict[str, Any]]) -> list[tuple[str, Verdict]]:
    """(settings label, verdict) per group of settings: by speedup vs AR when every candidate has one,
    else by tok/s; the aggregate rows stand for their repeats when there are any."""
    aggregates = [r for r in rows if str(r.get("repeat")) == ALL]
    cands = aggregates or rows
    cands = [r for r in cands if r.get("status") == "ok"]
    repeats = max([int(r.get("repeats_ok") or 1) for r in aggregates] or [1])
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in cands:
        groups.setdefault(_settings(r), []).append(r)
    keys = ("backend", "model", "dtype", "device", "suite", "concurrency", "request_rate", "temperature")
    varying = [k for k in keys if len({str(r.get(k)) for r in cands}) > 1]
    unhonoured = {k for k, _ in _unhonoured(rows)}
    out = []
    for key, rs in groups.items():
        if key in unhonoured:
            continue
        metric = "speedup_vs_ar" if all(r.get("speedup_vs_ar") not in (None, "") for r in rs) else "output_throughput_tok_s"
        method = BOOTSTRAP_2WAY if aggregates else BOOTSTRAP
        if metric == "output_throughput_tok_s":
            method = STUDENT_T
        with_k = len({str(r.get("spec_tokens")) for r in rs if r.get("method") != "ar"}) > 1
        cs = [Candidate(config_label(r, with_k), float(r[metric]) if r.get(metric) not in (None, "") else None,
                        _interval(r, metric, method, repeats), r) for r in rs]
        out.append((_settings_label(rs[0], varying), decide(cs, metric, repeats)))
    return out


def _unhonoured(rows: list[dict[str, Any]]) -> list[tuple[tuple, dict[str, Any]]]:
    """(settings, first such row) per group of settings in which some point's concurrency was not honoured
    (the backend ran its requests one at a time, or fewer at once than asked): such a group gets no takeaway,
    since its rows are not measurements at the load they are labelled with."""
    out: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        if str(r.get("concurrency_honoured")) == "False":
            out.setdefault(_settings(r), r)
    return list(out.items())


def no_takeaways(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """{settings label, why} per group of settings that gets no takeaway because a load was not honoured."""
    cands = [r for r in rows if r.get("status") == "ok"]
    keys = ("backend", "model", "dtype", "device", "suite", "concurrency", "request_rate", "temperature")
    varying = [k for k in keys if len({str(r.get(k)) for r in cands}) > 1]
    out = []
    for key, first in _unhonoured(rows):
        who = ", ".join(dict.fromkeys(config_label(r) for r in rows
                                      if _settings(r) == key and str(r.get("concurrency_honoured")) == "False"))
        out.append({"settings": _settings_label(first, varying),
                    "why": f"concurrency {first.get('concurrency')} not honoured ({who}): "
                           + str(first.get("concurrency_why") or "the backend did not run the requests at once")})
    return out


def closing_line(rows: list[dict[str, Any]]) -> str:
    """The sweep's last console line(s): one takeaway per group of settings, and a 'no takeaway' line for
    each group whose load was not honoured."""
    lines = []
    for label, v in takeaways(rows):
        lines.append(("takeaway" + (f" ({label})" if label else "") + ": ") + sentence(v))
    for t in no_takeaways(rows):
        lines.append("no takeaway" + (f" ({t['settings']})" if t["settings"] else "") + ": " + t["why"])
    return "\n".join(lines)


# ---------------------------------------------------------------------------- summary.json


def write_summary(sdir, rows: list[dict[str, Any]], aggregates: list[dict[str, Any]], schedule: Any = None,
                  correctness: dict[str, Any] | None = None) -> dict[str, Any]:
    """The sweep directory's summary.json (module docstring); returns what it wrote."""
    from ddtree_bench.env import now_iso
    from ddtree_bench.results import write_json_atomic

    allrows = rows + aggregates
    doc = {"kind": SUMMARY_KIND, "version": SUMMARY_VERSION, "written_at": now_iso(), "intervals": interval_method(),
           "schedule": schedule, "rows": allrows,
           "takeaways": [{"settings": label, **v.to_dict()} for label, v in takeaways(allrows)],
           "no_takeaway": no_takeaways(allrows), "correctness": correctness}
    for t in doc["takeaways"]:
        for c in t["ranked"]:
            c.pop("ref", None)
    write_json_atomic(sdir.root / "summary.json", doc)
    return doc


def read_summary(sweep_dir: Path) -> dict[str, Any] | None:
    """A sweep's summary.json, or None when there is none (sweeps before this file existed)."""
    from ddtree_bench.results import read_json

    path = Path(sweep_dir) / "summary.json"
    if not path.exists():
        return None
    doc = read_json(path)
    if not isinstance(doc, dict) or doc.get("kind") != SUMMARY_KIND:
        raise UsageError(f"{path}: not a ddtree-bench sweep summary")
    if not isinstance(doc.get("version"), int) or doc["version"] > SUMMARY_VERSION:
        raise UsageError(f"{path}: summary version {doc.get('version')!r} is newer than this ddtree-bench reads "
                         f"(up to {SUMMARY_VERSION})", hint="upgrade ddtree-bench")
    return doc
