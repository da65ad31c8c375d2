"""A sweep from start to end: its directory (new, or the latest for a bare `--resume`), the lock
held for its whole life, preparation (`sweep/prepare.py`, exit 2 on bad input before any work), the
plan printed before it runs (`sweep/plan.py`), sweep.json, the loop (`sweep/loop.py`: batches in
this process, or on the executor `sweep/executor_choice.py` picks for `--workers` / `--executor
ray`), and at the end, even after a failure or Ctrl-C, the correctness of every finished point
(`sweep/correctness.py`: greedy outputs vs the sweep's AR point and --baseline) and summary.csv
with the aggregate rows and their intervals (`sweep/aggregate.py`).

Bad input is found before anything runs (exit 2). Ctrl-C / SIGTERM stop the servers (process
groups) and leave the directory resumable; --resume keeps the stored grid (with this invocation's
where-to-run settings) and reaps servers a killed driver left behind.

Knows the sweep directory's life; what runs a point is the loop's.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddtree_bench.env import environment, now_iso
from ddtree_bench.errors import UsageError
from ddtree_bench.outpaths import check_output_dir, make_dirs
from ddtree_bench.results import read_json
from ddtree_bench.sweep import aggregate as A
from ddtree_bench.sweep import correctness as K
from ddtree_bench.sweep import executors as X
from ddtree_bench.sweep import order as O
from ddtree_bench.sweep import plan as P
from ddtree_bench.sweep import ray_executor as RX
from ddtree_bench.sweep.executor_choice import make_executor
from ddtree_bench.sweep.grid import GridSpec, Point
from ddtree_bench.sweep.layout import SweepDir
from ddtree_bench.sweep.lock import LOCK_NAME, SweepLock, describe_holder
from ddtree_bench.sweep.loop import SweepLoop
from ddtree_bench.sweep.prepare import prepare
from ddtree_bench.sweep.server import reap_recorded


@dataclass
class SweepOutcome:
    out: Path
    points: list[Point]
    rows: list[dict[str, Any]]
    failed: list[str] = field(default_factory=list)
    skipped: int = 0            # finished before this invocation (--resume)
    auto_ar: bool = False
    correctness: list[str] = field(default_factory=list)    # the closing verdict lines (sweep/correctness.py)
    diverged: list[str] = field(default_factory=list)       # point ids whose outputs confidently diverge


# --------------------------------------------------------------------------- directories


def new_sweep_dir(grid: GridSpec, root: Path = Path("results")) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = root / f"{stamp}-sweep-{'-'.join(grid.backends)}"
    out, n = base, 2
    while out.exists():
        out, n = Path(f"{base}-{n}"), n + 1
    return out


def latest_sweep(root: Path = Path("results")) -> Path:
    """The most recently started sweep directory under `root` (for a bare `--resume`)."""
    found = []
    for d in root.iterdir() if root.is_dir() else []:
        f = d / "sweep.json"
        if f.is_file():
            try:
                found.append((read_json(f).get("created_at") or "", f.stat().st_mtime, d))
            except UsageError:
                continue
    if not found:
        raise UsageError(f"--resume: no sweep directory under {root}/", hint="pass the directory: --resume results/<sweep-id>")
    return max(found, key=lambda t: (t[0], t[1]))[2]


# --------------------------------------------------------------------------- signals


@contextmanager
def _sigterm_as_interrupt(out: Path):
    """Turn SIGTERM into KeyboardInterrupt while the sweep runs, so `finally` blocks stop the servers; an interrupted
    sweep's error line is followed by the command that continues it."""
    from ddtree_bench.errors import INTERRUPT, sigterm_to_interrupt

    INTERRUPT["hint"] = f"continue it with: ddtree-bench sweep --resume {out}"
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, sigterm_to_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


# --------------------------------------------------------------------------- the sweep


def run_sweep(grid: GridSpec, out: Path, *, resume: bool = False, api_key: str | None = None, progress: bool = True,
              echo: Callable[[str], None] = print, baseline: Path | None = None,
              allow_model_mismatch: bool = False) -> SweepOutcome:
    """Run (or resume) a sweep into `out`. Raises UsageError before any work on bad input.

    After the points ran, every finished point's greedy outputs are judged against the sweep's AR
    point and against `baseline` when given (sweep/correctness.py); the baseline file is read (and
    its model checked against the grid's) before any work. A resumed sweep keeps the baseline
    recorded in sweep.json unless another is given.

    The driver holds `SweepLock(out)` for the sweep's whole life: a second sweep or --resume on the
    same directory is exit 2 naming the holder; a lock left by a driver that died is taken over
    with a note. --resume first reaps servers an earlier, killed driver left running."""
    out = Path(out)
    sdir = SweepDir(out)
    if resume and not out.is_dir():
        raise UsageError(f"{out} is not a sweep directory (it does not exist)")
    check_output_dir(out)
    created = not out.exists()
    make_dirs(out)
    lock = SweepLock(out)
    try:
        lock.acquire(warn=echo)
    except UsageError:
        if created:
            _rmdir_if_empty(out)
        raise
    try:
        if lock.taken_over:
            echo(f"note: took over the lock of a sweep that died: {describe_holder(lock.taken_over)}")
        return _run_locked(grid, out, sdir, resume, api_key, progress, echo, baseline, allow_model_mismatch)
    finally:
        lock.release()
        if created:
            _rmdir_if_empty(out)  # bad input found before anything was written: leave no empty directory


def _rmdir_if_empty(path: Path) -> None:
    try:
        path.rmdir()  # fails (harmlessly) unless empty
    except OSError:
        pass


def _run_locked(grid: GridSpec, out: Path, sdir: SweepDir, resume: bool, api_key: str | None, progress: bool,
                echo: Callable[[str], None], baseline_path: Path | None = None,
                allow_model_mismatch: bool = False) -> SweepOutcome:
    if resume:
        info = sdir.read()
        grid = X.keep_execution(GridSpec.from_dict(info["grid"]), grid)  # this invocation's workers / executor
        reap_recorded(sdir.servers_dir, echo)
        stored = info.get("baseline") or {}
        if baseline_path is None and stored.get("path"):
            baseline_path = Path(stored["path"])
            allow_model_mismatch = allow_model_mismatch or bool(stored.get("allow_model_mismatch"))
    elif any(f.name != LOCK_NAME for f in out.iterdir()):
        raise UsageError(f"{out} already exists and is not empty", hint=f"continue it with: ddtree-bench sweep --resume {out}")
    baseline = None
    if baseline_path is not None:  # bad input before any work: unreadable, or of another model
        from ddtree_bench.baselines.file import read_baseline

        baseline = read_baseline(baseline_path)
        K.check_baseline_model(baseline, grid.models, allow_model_mismatch)
    prep = prepare(grid, api_key, RX.external_device_fn(grid))
    executor = make_executor(grid, prep.points, echo)  # exit 2 for a layout this host cannot give, or no Ray cluster
    auto_ar = "ar" not in grid.methods
    if resume:
        stored = [pt["id"] for pt in info["points"]]
        if stored != [p.id for p in prep.points]:
            raise UsageError(f"{sdir.sweep_json}: its points no longer match its grid (made by another version?)")
    else:
        O.fix_seed(grid)
        sdir.create({"kind": "ddtree-bench-sweep", "version": 2, "schedule": O.describe_for(grid, prep.points),
                     "sweep_id": sdir.id, "created_at": now_iso(),
                     "grid": grid.to_dict(), "auto_ar": auto_ar, "points": [p.to_dict() for p in prep.points],
                     "profiles": {b: pr.to_dict() for b, pr in prep.profiles.items()}, **environment(None)})
    if baseline_path is not None:
        sdir.update(baseline={"path": str(baseline_path), "allow_model_mismatch": allow_model_mismatch})
    skipped = sum(1 for p in prep.points if sdir.finished(p.id))
    sdir.rewrite_csv(sdir.rows([p for p in prep.points if sdir.finished(p.id)]))
    for line in P.plan_for(grid, prep.points, sdir, executor).lines():
        echo(line)
    sweep = SweepLoop(grid, prep, sdir, progress, echo)
    sweep.executor = executor
    finished_loop = False
    try:
        with _sigterm_as_interrupt(out):
            sweep.run()
        finished_loop = True
    finally:
        # correctness: re-scoring gaps may load the reference engine, so not after a Ctrl-C
        judge_error, judged = None, {}
        try:
            judged = K.judge_sweep(sdir, prep.points, baseline, allow_model_mismatch, rescore=finished_loop)
        except Exception as e:  # the rows and summary are still written; the error is raised after them
            judge_error = e
        rows = sdir.rows(prep.points)
        aggregates = A.aggregate_rows(sdir, prep.points, rows)  # `repeat` = `all` rows with the intervals
        sdir.rewrite_csv(rows + aggregates)
        verdict = K.closing_lines(rows, str(baseline_path) if baseline_path is not None else None, judged)
        A.write_summary(sdir, rows, aggregates, O.describe_for(grid, prep.points),
                        {"lines": verdict, "diverged": [r["point_id"] for r in K.failures(rows)]})
        sdir.update(last_run_at=now_iso(), complete=all(sdir.finished(p.id) for p in prep.points))
    if judge_error is not None:
        raise judge_error
    failed = [r["point_id"] for r in rows if r["status"] not in ("ok", "unsupported")]
    return SweepOutcome(out, prep.points, rows, failed, skipped, auto_ar, verdict, [r["point_id"] for r in K.failures(rows)])
