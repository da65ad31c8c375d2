"""Helpers the sweep and process tests share: run the CLI in-process (also for a command's JSON
document) or as a child process, start a sweep in the background and wait for its server's pid
record, read summary.csv, watch processes (by session or process group).

Knows /proc and the CLI entry point; nothing of any one test's grid.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_cli(argv) -> int:
    """`ddtree-bench ARGV` in this process; its exit code."""
    from ddtree_bench.cli import main

    try:
        main(argv)
    except SystemExit as e:
        return e.code
    return 0


@dataclass
class CliResult:
    """One in-process CLI call: its exit code and what it printed (the fields of a CompletedProcess)."""
    returncode: int
    stdout: str
    stderr: str


def cli_in_process(capsys, *args: str, check: bool = True) -> CliResult:
    """`ddtree-bench ARGS` in this process, its output read through pytest's capsys: what `cli_process`
    gives, without a Python and torch start-up per call. With `check`, a nonzero exit fails the test
    with the command's output."""
    capsys.readouterr()   # only this call's output
    rc = run_cli(list(args))
    said = capsys.readouterr()
    res = CliResult(0 if rc is None else rc, said.out, said.err)
    if check and res.returncode != 0:
        raise AssertionError(f"ddtree-bench {' '.join(args)} exited {res.returncode}:\n{res.stdout}\n{res.stderr}")
    return res


def cli_json(capsys, *args: str, out: Path) -> tuple[str, dict, dict]:
    """`ddtree-bench ARGS --out OUT` in this process (must exit 0) for a command that writes a JSON document
    to OUT and prints one as its last stdout line: (stdout, OUT's document, the last line's document)."""
    rc = run_cli([*args, "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, f"ddtree-bench {' '.join(args)} exited {rc}:\n{text}"
    return text, json.loads(out.read_text()), json.loads(text.strip().splitlines()[-1])


def cli_process(*args: str, timeout_s: float = 900.0, check: bool = True) -> subprocess.CompletedProcess:
    """`python -m ddtree_bench ARGS` in a child process (cwd the repo root, OMP_NUM_THREADS=1), output
    captured; with `check`, a nonzero exit fails the test with the command's output."""
    p = subprocess.run([sys.executable, "-m", "ddtree_bench", *args], capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=timeout_s, cwd=ROOT)
    if check and p.returncode != 0:
        raise AssertionError(f"ddtree-bench {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


@contextmanager
def background_sweep(*args: str, out: Path, cwd: Path):
    """`python -m ddtree_bench sweep ARGS --out OUT` in the background (output discarded) until its launched
    server's pid record (OUT/servers/*.pid.json) appears; yields (process, record path). The sweep is
    killed on leaving the block if it is still running."""
    proc = subprocess.Popen([sys.executable, "-m", "ddtree_bench", "sweep", *args, "--out", str(out)], cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        servers = out / "servers"
        rec = wait_for(lambda: next(iter(servers.glob("*.pid.json")), None) if servers.is_dir() else None)
        assert rec is not None, "the sweep never recorded its server"
        yield proc, rec
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@contextmanager
def started_together(starters: dict):
    """Start every server of `starters` (name -> a no-argument function returning an object with
    `wait_ready()` and `stop()`), wait until all are ready, yield {name: server}; stop them all on the way
    out, also when a start or a wait fails (the ones already started are stopped)."""
    servers = {}
    try:
        for name, start in starters.items():
            servers[name] = start()
        for srv in servers.values():
            srv.wait_ready()
        yield servers
    finally:
        for srv in servers.values():
            srv.stop()


def csv_rows(out: Path) -> list[dict]:
    with open(out / "summary.csv", newline="") as f:
        return list(csv.DictReader(f))


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def members(*, session: int | None = None, group: int | None = None) -> list[int]:
    """Live (not zombie) processes whose session id or process group id is the one given (/proc/<pid>/stat)."""
    field, want = (3, session) if session is not None else (2, group)
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                f = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if f[0] != "Z" and int(f[field]) == want:
                out.append(int(d.name))
    return out


def wait_for(pred, timeout_s: float = 240.0, step_s: float = 0.1):
    """Poll `pred` until it returns something truthy (returned) or `timeout_s` passes (its last value)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step_s)
    return pred()
