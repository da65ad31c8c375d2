"""Sweeps with `--workers N` (issue 21): server groups at once on one host, pinned, written by the driver.

* a parallel sweep over in-process and `ddtree-bench serve` groups gives the serial sweep's result
  files: the same point ids, statuses, outputs and tau, the same files per point, the same columns;
  every worker (and its server) really runs on its own fake GPU ids and its own CPU cores, points of
  one group on one worker, each server with its own log;
* a worker SIGKILLed mid-sweep fails only its unreported points (with the reason), the other groups
  finish, and `--resume --workers 2` completes it; a SIGKILLed driver takes its workers and servers
  with it and `--resume` completes that too;
* slots: GPUs and cores split without overlap, too few GPUs for CUDA points is exit 2;
* `--dry-run` prints the plan and writes nothing; the estimate uses points already measured;
* `--executor ray` without ray installed is exit 2 with the install hint.

The grid, its serial sweep and the digest compared come from tests/sweep_support.py (the serial
sweep is shared with tests/sweep/test_ray.py: run once per session).
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_bench import defaults as D
from ddtree_bench.sweep.executors import assign_slots
from ddtree_bench.sweep.layout import COLUMNS
from process_support import run_cli, csv_rows, alive, wait_for
from sweep_support import GRID, results

FAKE_GPUS = "5,7,9,11"


def children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def is_worker(pid: int) -> bool:
    try:
        return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()  # not the resource tracker
    except OSError:
        return False


# --------------------------------------------------------------------------- slots


def test_slots_split_gpus_and_cores_without_overlap_and_refuse_too_few_gpus():
    from ddtree_bench.errors import UsageError

    slots = assign_slots(4, 2, True, [str(i) for i in range(8)], list(range(16)))
    assert [s.devices for s in slots] == [["0", "1"], ["2", "3"], ["4", "5"], ["6", "7"]]
    assert [s.cores for s in slots] == [list(range(i * 4, i * 4 + 4)) for i in range(4)]
    assert slots[1].env() == {"CUDA_VISIBLE_DEVICES": "2,3", "OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4"}
    with pytest.raises(UsageError, match="needs 6 GPUs; 4 visible"):
        assign_slots(3, 2, True, ["0", "1", "2", "3"], [0, 1])
    cpu = assign_slots(3, 2, False, ["0", "1", "2", "3"], [0, 1])  # CPU points: GPUs not required, cores shared
    assert [s.devices for s in cpu] == [[], [], []] and [s.cores for s in cpu] == [[0], [1], [0]]


# --------------------------------------------------------------------------- equal to serial


@pytest.mark.slow
def test_parallel_sweep_writes_the_serial_results_each_worker_pinned(serial, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", FAKE_GPUS)
    out = tmp_path / "par"
    assert run_cli(["sweep", *GRID, "--workers", "2", "--gpus-per-point", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "plan: 4 points (0 finished, 4 to run), 4 server groups, 2 workers (local)" in printed
    assert "worker 0: GPUs 5,7" in printed and "worker 1: GPUs 9,11" in printed

    assert results(out) == results(serial)  # ids, statuses, tau, files, outputs
    with open(out / "summary.csv", newline="") as f:
        assert next(csv.reader(f)) == list(COLUMNS)
    assert sorted(r["point_id"] for r in csv_rows(out)) == sorted(r["point_id"] for r in csv_rows(serial))
    sweep = json.loads((out / "sweep.json").read_text())
    assert sweep["complete"] is True and sweep["grid"]["workers"] == 2
    assert not [d for d in (out / "points").iterdir() if d.name.startswith(".")]  # no staging left behind

    slots = {"5,7": None, "9,11": None}
    worker_of_group: dict[tuple, set] = {}
    for p in sweep["points"]:
        w = json.loads((out / "points" / p["id"] / "status.json").read_text())["worker"]
        assert w["executor"] == "local" and w["cuda_visible_devices"] in slots
        assert w["cpu_affinity"] == w["pinned_cores"] and w["omp_num_threads"] == str(len(w["pinned_cores"]))
        if slots[w["cuda_visible_devices"]] is None:
            slots[w["cuda_visible_devices"]] = w["pinned_cores"]
        assert slots[w["cuda_visible_devices"]] == w["pinned_cores"]  # one slot, one core set
        if p["backend"] == "standalone":  # its server inherited the pinning
            srv = w["server"]
            assert srv["cuda_visible_devices"] == w["cuda_visible_devices"] and srv["cpu_affinity"] == w["cpu_affinity"]
            assert srv["omp_num_threads"] == w["omp_num_threads"]
            server = json.loads((out / "points" / p["id"] / "server.json").read_text())
            assert server["log"].startswith(str(out / "servers"))  # the worker's scratch path rewritten
            assert (out / "servers" / Path(server["log"]).name).is_file()
        worker_of_group.setdefault((p["backend"], p["method"], p["budget"]), set()).add(w["pid"])
    assert all(len(pids) == 1 for pids in worker_of_group.values())
    if len(os.sched_getaffinity(0)) >= 2:
        assert slots["5,7"] != slots["9,11"] and not set(slots["5,7"]) & set(slots["9,11"])
    for log in (out / "servers").glob("*.log"):  # one server per log file
        assert log.read_text().count("\n$ ") == 0 and log.read_text().startswith("$ ")


# --------------------------------------------------------------------------- faults


def _sweep_proc(out: Path, *extra: str) -> subprocess.Popen:
    """The sweep in its own session (so the test can signal its whole group, as a terminal would), with SIGINT at its
    default: a shell that runs the tests in the background (`pytest ... &`) leaves SIGINT ignored, children inherit
    that, and Python then never raises KeyboardInterrupt - Ctrl-C would never reach the sweep, and the ctrl-c test
    fail for the shell's reason, not the sweep's."""
    return subprocess.Popen([sys.executable, "-m", "ddtree_bench", "sweep", *GRID, "--workers", "2", "--out", str(out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _finished(out: Path) -> list[Path]:
    pts = out / "points"
    return [d for d in pts.iterdir() if not d.name.startswith(".") and (d / "summary.json").exists()] if pts.is_dir() else []


@pytest.mark.slow
def test_a_killed_worker_fails_only_its_points_and_resume_completes(serial, tmp_path):
    out = tmp_path / "sw"
    proc = _sweep_proc(out)
    try:
        def busy_workers():
            """Workers mid-group: one serving a standalone group has its server (and watchdog) as children.
            Killing an idle worker between groups would fail nothing, and the test would race."""
            if not _finished(out):
                return None
            ws = [c for c in children(proc.pid) if is_worker(c)]
            return [w for w in ws if children(w)] or None

        workers = wait_for(busy_workers)
        assert workers, "no worker serving a group after the first finished point"
        victim = workers[0]
        os.kill(victim, signal.SIGKILL)
        text = proc.communicate(timeout=300)[0].decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, text
    rows = csv_rows(out)
    failed = [r for r in rows if r["status"] == "failed"]
    assert failed and all("worker process exited with code -9" in r["error"] for r in failed), failed
    assert len(failed) < len(rows) and len(rows) == 4
    assert run_cli(["sweep", "--resume", str(out), "--workers", "2", "-q", "--no-report"]) == 0
    assert results(out) == results(serial)


@pytest.mark.slow
def test_a_killed_driver_takes_workers_and_servers_with_it_and_resume_completes(serial, tmp_path):
    out = tmp_path / "sw"
    proc = _sweep_proc(out)
    try:
        assert wait_for(lambda: _finished(out))
        family = [c for c in children(proc.pid) if is_worker(c)]
        family += [g for c in family for g in children(c)]  # servers, watchdogs
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert family
    assert wait_for(lambda: not [p for p in family if alive(p)], timeout_s=60), [p for p in family if alive(p)]
    assert run_cli(["sweep", "--resume", str(out), "--workers", "2", "-q", "--no-report"]) == 0
    assert results(out) == results(serial)


@pytest.mark.slow
def test_ctrl_c_stops_every_worker_and_server_and_leaves_the_sweep_resumable(tmp_path):
    out = tmp_path / "sw"
    proc = _sweep_proc(out)
    try:
        def cmdline(pid: int) -> bytes:
            try:
                return Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:  # it exited between listing and reading
                return b""

        def running_server():
            workers = [c for c in children(proc.pid) if is_worker(c)]
            servers = [g for w in workers for g in children(w) if b"serve" in cmdline(g)]
            return (workers, servers) if servers else None

        n_points = len(json.loads((out / "sweep.json").read_text())["points"]) if (out / "sweep.json").exists() else None
        family = None
        for _ in range(20):
            found = wait_for(running_server)
            assert found, "no server started"
            # Freeze the whole group, then check the state the test needs still holds: on a loaded machine
            # the sweep could otherwise finish (exit 0) between seeing the server and the interrupt landing.
            os.killpg(proc.pid, signal.SIGSTOP)
            n_points = n_points or len(json.loads((out / "sweep.json").read_text())["points"])
            if all(alive(p) for p in found[0] + found[1]) and len(_finished(out)) < n_points:
                family = found[0] + found[1]
                break
            os.killpg(proc.pid, signal.SIGCONT)
        assert family, "never caught a server mid-sweep"
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        os.killpg(proc.pid, signal.SIGCONT)  # delivered as the group resumes, with work still left to do
        text = proc.communicate(timeout=120)[0].decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "error: interrupted" in text and f"hint: continue it with: ddtree-bench sweep --resume {out}" in text, text
    assert wait_for(lambda: not [p for p in family if alive(p)], timeout_s=30), [p for p in family if alive(p)]
    sweep = json.loads((out / "sweep.json").read_text())
    assert sweep["complete"] is False and not (out / ".sweep.lock").exists()


# --------------------------------------------------------------------------- plan, dry run, ray missing


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert run_cli(["sweep", "--dry-run", "--workers", "2", "--budgets", "16..1024"]) == 0
    printed = capsys.readouterr().out
    assert "plan: 9 points (0 finished, 9 to run), 9 server groups, 2 workers (local)" in printed
    assert "from stated defaults" in printed and "dry run: nothing was started or written" in printed
    assert not (tmp_path / "results").exists()
    assert run_cli(["sweep", "--dry-run", "--workers", "0"]) == 2
    assert "workers: 0 is below the minimum 1" in capsys.readouterr().err


def test_the_stated_estimate_scales_with_the_grids_prompts_and_tokens(tmp_path, monkeypatch, capsys):
    """--limit / --max-new-tokens change the work of every point: the estimate from stated defaults follows."""
    import re

    monkeypatch.chdir(tmp_path)

    def estimate(*args: str) -> int:
        assert run_cli(["sweep", "--dry-run", "--budgets", "16", *args]) == 0
        m = re.search(r"plan: estimated (?:(\d+) min )?(\d+) s", capsys.readouterr().out)
        return int(m.group(1) or 0) * 60 + int(m.group(2))

    base = estimate()
    assert estimate("--limit", str(4 * D.SWEEP_LIMIT)) == pytest.approx(4 * base, abs=2)
    assert estimate("--max-new-tokens", str(D.SWEEP_MAX_NEW_TOKENS // 4)) == pytest.approx(base / 4, abs=2)


def test_plan_wall_time_is_the_longest_first_schedule():
    from ddtree_bench.sweep.plan import makespan

    assert makespan([5, 4, 3, 3, 3], 2) == 10  # LPT: 5 | 4, 3 | +3 on the 5 | +3 on the 7 -> 10 (the best is 9)
    assert makespan([10], 4) == 10 and makespan([], 3) == 0 and makespan([2, 2, 2], 8) == 2


@pytest.mark.slow
def test_resume_dry_run_estimates_from_the_points_already_measured(serial, capsys):
    assert run_cli(["sweep", "--resume", str(serial), "--dry-run", "--workers", "3"]) == 0
    printed = capsys.readouterr().out
    assert "plan: 4 points (4 finished, 0 to run), 0 server groups, 3 workers (local)" in printed
    assert "from 4 points measured in this directory" in printed


def test_executor_ray_without_ray_is_exit_2_with_the_install_hint(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    monkeypatch.chdir(tmp_path)
    assert run_cli(["sweep", "--models", "random", "--suites", "smoke", "--executor", "ray", "--no-report", "-q"]) == 2
    err = capsys.readouterr().err
    assert "--executor ray needs the ray package" in err and 'pip install -e ".[ray]"' in err
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())
    assert run_cli(["sweep", "--executor", "spark"]) == 2
    assert "unknown executor 'spark'" in capsys.readouterr().err
