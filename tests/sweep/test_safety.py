"""Sweeps that never destroy results (issue 17, data safety).

* two sweeps, or two --resume, on one directory at once: one runs, the other is exit 2 naming the
  holder (pid, host, start), and the survivor's results are whole;
* a lock left by a SIGKILLed driver is taken over with a note;
* a SIGKILLed sweep's server dies with it (`ddtree-bench serve --null` as the launched server), and
  --resume reaps a recorded server that outlived its driver but never a reused pid;
* RunWriter staging belongs to one writer: another writer's staging or finished run is never
  deleted or truncated.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddtree_bench.results import RunWriter
from ddtree_bench.sweep.lock import LOCK_NAME, SweepLock
from ddtree_bench.sweep.server import reap_recorded, write_record
from process_support import alive, background_sweep, members, wait_for

SWEEP = [sys.executable, "-m", "ddtree_bench", "sweep", "--models", "random", "--suites", "smoke", "--methods", "ar",
         "--limit", "2", "--max-new-tokens", "4", "--no-report", "-q"]


def finished_points(out: Path) -> list[Path]:
    return [d for d in (out / "points").iterdir() if not d.name.startswith(".") and (d / "summary.json").exists()]


def assert_whole(out: Path) -> None:
    sweep = json.loads((out / "sweep.json").read_text())
    assert sweep["complete"] is True
    for p in sweep["points"]:
        d = out / "points" / p["id"]
        assert (d / "summary.json").exists(), p["id"]
        assert (d / "records.jsonl").read_text().count("\n") >= 1, p["id"]  # never truncated to 0 lines
    assert (out / "summary.csv").exists() and not (out / LOCK_NAME).exists()


def test_two_sweeps_on_one_directory_one_runs_the_other_is_exit_2_naming_the_holder(tmp_path):
    out = tmp_path / "sw"
    procs = [subprocess.Popen(SWEEP + ["--out", str(out)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    res = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    codes = sorted(r[2] for r in res)
    assert codes == [0, 2], res
    loser = next(r for r in res if r[2] == 2)
    assert loser[1].startswith("error: ") and "internal error" not in loser[1] and "Traceback" not in loser[1]
    # the loser either found the lock (naming its holder) or, if it came second, a sweep already there
    assert "in use by another sweep: pid " in loser[1] or "already exists and is not empty" in loser[1]
    assert_whole(out)


def test_two_resumes_half_a_second_apart_leave_every_point_whole(tmp_path):
    out = tmp_path / "sw"
    subprocess.run(SWEEP + ["--out", str(out)], cwd=tmp_path, check=True, capture_output=True, timeout=300)
    for d in (out / "points").iterdir():  # every point must run again
        (d / "summary.json").unlink()
    a = subprocess.Popen([sys.executable, "-m", "ddtree_bench", "sweep", "--resume", str(out), "--no-report", "-q"],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: (out / LOCK_NAME).exists() and (out / LOCK_NAME).stat().st_size > 0, 60, 0.02)
    time.sleep(0.5)
    b = subprocess.run([sys.executable, "-m", "ddtree_bench", "sweep", "--resume", str(out), "--no-report", "-q"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    a_out, a_err = a.communicate(timeout=300)
    if b.returncode == 2:  # b arrived while a held the lock
        assert a.returncode == 0, a_err
        assert f"in use by another sweep: pid {a.pid} on " in b.stderr and "started 20" in b.stderr
    else:  # a had already finished: b resumed a complete sweep
        assert a.returncode == 0 and b.returncode == 0
    assert_whole(out)


def test_a_held_lock_names_its_holder_and_a_dead_holders_lock_is_taken_over(tmp_path):
    d = tmp_path / "sw"
    d.mkdir()
    held = SweepLock(d).acquire()
    try:
        with pytest.raises(Exception) as e:
            SweepLock(d).acquire()
        assert type(e.value).__name__ == "UsageError" and f"pid {os.getpid()} on " in str(e.value)
    finally:
        held.release()
    assert not (d / LOCK_NAME).exists()
    # a lock file left by a driver that died (its flock is gone, its record is not)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    (d / LOCK_NAME).write_text(json.dumps({"pid": int(dead), "host": "h", "started_at": "2026-01-01T00:00:00+00:00"}))
    lock = SweepLock(d).acquire()
    try:
        assert lock.taken_over["pid"] == int(dead)
        assert json.loads((d / LOCK_NAME).read_text())["pid"] == os.getpid()
    finally:
        lock.release()


# one request of 2000 tokens on the profile's null server: minutes of work, time to kill the sweep
SLOW_SWEEP = ["--backends", "standalone", "--models", "random", "--suites", "smoke", "--methods", "ar", "--limit", "1",
              "--max-new-tokens", "2000", "--warmup", "0", "--no-report", "-q"]


def _null_profile(dirpath: Path, delay_ms: int) -> Path:
    dirpath.mkdir(exist_ok=True)
    (dirpath / "standalone.yaml").write_text(
        "name: standalone\n"
        f"argv: ['{sys.executable}', -m, ddtree_bench, serve, --null, --null-delay-ms, '{delay_ms}', --host, '{{host}}', "
        "--port, '{port}']\n"
        "method_args: {ar: [], dflash: [], ddtree: []}\nhealth_path: /health\n")
    return dirpath


def test_a_sigkilled_sweep_takes_its_server_with_it_and_resume_takes_over(tmp_path):
    prof = _null_profile(tmp_path / "prof", delay_ms=200)  # 2000 tokens at 4 a chunk: minutes per request
    out = tmp_path / "sw"
    with background_sweep(*SLOW_SWEEP, "--profiles", str(prof), out=out, cwd=tmp_path) as (proc, rec):
        server = json.loads(rec.read_text())["pid"]
        assert wait_for(lambda: alive(server), 10)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert wait_for(lambda: not alive(server), 30), "the server outlived the SIGKILLed sweep"
    # resume: takes over the dead driver's lock, says so, and finishes with a fast server
    _null_profile(prof, delay_ms=0)
    r = subprocess.run([sys.executable, "-m", "ddtree_bench", "sweep", "--resume", str(out), "--no-report", "-q"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"took over the lock of a sweep that died: pid {proc.pid} on " in r.stdout
    assert_whole(out)


def test_a_sigkilled_sweep_takes_its_servers_grandchildren_with_it(tmp_path):
    """The leader dies by PDEATHSIG; the watchdog kills the rest of the server's group."""
    prof = tmp_path / "prof"
    prof.mkdir()
    (prof / "standalone.yaml").write_text(
        "name: standalone\n"
        f"argv: [sh, -c, '\"{sys.executable}\" -m ddtree_bench serve --null --null-delay-ms 200 --host {{host}} --port {{port}}"
        " & wait']\n"
        "method_args: {ar: [], dflash: [], ddtree: []}\nhealth_path: /health\n")
    with background_sweep(*SLOW_SWEEP, "--profiles", str(prof), out=tmp_path / "sw", cwd=tmp_path) as (proc, rec):
        pgid = json.loads(rec.read_text())["pgid"]
        group_pids = wait_for(lambda: [p for p in members(group=pgid) if p != pgid] and members(group=pgid), 30)
        assert len(group_pids) >= 2, group_pids  # sh and its child, the server
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert wait_for(lambda: not [p for p in group_pids if alive(p)], 30), "part of the server's group outlived the sweep"


def test_resume_reaps_a_recorded_server_that_outlived_its_driver_but_never_a_reused_pid(tmp_path):
    servers = tmp_path / "servers"
    survivor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        assert wait_for(lambda: alive(survivor.pid) and alive(stranger.pid), 10)
        write_record(servers / "a-0.pid.json", survivor.pid, ["engine-serve"])
        rec = write_record(servers / "b-0.pid.json", stranger.pid, ["engine-serve"])
        doc = json.loads(rec.read_text())
        doc["start_ticks"] += 12345  # the pid now belongs to a process started at another time: not ours
        rec.write_text(json.dumps(doc))
        said = []
        killed = reap_recorded(servers, said.append, grace_s=2.0)
        assert killed == [survivor.pid] and len(said) == 1 and str(survivor.pid) in said[0]
        assert survivor.wait(timeout=10) is not None
        assert alive(stranger.pid)
        assert not list(servers.glob("*.pid.json"))  # records are consumed either way
    finally:
        for p in (survivor, stranger):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_run_writers_never_delete_or_truncate_each_others_work(tmp_path):
    out = tmp_path / "run"
    a, b = RunWriter(out), RunWriter(out)
    assert a.staging != b.staging and a.staging.exists() and b.staging.exists()
    a.write_run({"kind": "ddtree-bench-run", "version": 2, "spec": {}})
    a.abort()  # a's failure leaves b's staging alone
    assert b.staging.exists()
    b.write_run({"kind": "ddtree-bench-run", "version": 2, "spec": {}})
    b.commit({"num_requests": 0})
    assert (out / "summary.json").exists()
    # a third writer over the finished run is refused, unless told to overwrite
    with pytest.raises(Exception, match="already holds a finished run"):
        RunWriter(out)
    # a dead process's staging dir (same host) is cleaned up; a live one's is not
    w = RunWriter(out, overwrite=True)
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout.strip()
    dead = w.staging.with_name(w.staging.name.replace(f"-{os.getpid()}-", f"-{dead_pid}-"))
    dead.mkdir()
    w2 = RunWriter(out, overwrite=True)
    assert not dead.exists() and w.staging.exists()
    w.abort()
    w2.abort()


def test_a_run_that_lost_its_out_keeps_its_results_under_a_name_no_cleanup_touches(tmp_path, capsys):
    """Two writers on one --out: the second to commit is refused and its results move to a visible NAME.kept-...;
    a later writer's clean-up of dead staging never removes them, and the staging name itself is no run to judge."""
    from ddtree_bench.errors import UsageError
    from ddtree_bench.results import read_run_info

    out = tmp_path / "run"
    a, b = RunWriter(out), RunWriter(out)
    for w in (a, b):
        w.write_run({"kind": "ddtree-bench-run", "version": 2, "spec": {}})
    with pytest.raises(UsageError, match="partial"):   # an unfinished run's staging is refused by every reader
        read_run_info(b.staging)
    from ddtree_bench.report.data import load_run

    with pytest.raises(UsageError, match="staging directory of an unfinished run"):   # the report too
        load_run(b.staging, "run")
    a.commit({"num_requests": 0})
    with pytest.raises(UsageError, match=r"filled by another process.*kept in .*run\.kept-") as e:
        b.commit({"num_requests": 0})
    kept = Path(str(e.value).rsplit("kept in ", 1)[1])
    assert kept.is_dir() and (kept / "summary.json").exists() and not b.staging.name.startswith(".")
    RunWriter(out, overwrite=True).abort()   # cleans dead staging: the kept results stay
    assert kept.is_dir() and read_run_info(kept)["version"] == 2
