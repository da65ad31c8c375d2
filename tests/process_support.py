"""Helpers the sweep and process tests share: run the CLI in-process (also for a command's JSON
document) or as a child process, start a sweep in the background and wait for its server's pid
record, read summary.csv, watch processes (by session or process group).

Knows /proc and the CLI entry point; nothing of any one test's grid.
"""

from __future__ import annotations

import csv
import json
import os
import signal
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
    """Start every server of `starters` (name -> a no-argument function returning a started
    ServerProcess), wait until all are ready, yield {name: server}; stop them all on the way
    out, also when a start or a wait fails (the ones already started are stopped). A server that failed only
    because a port was taken while it started (two SGLang servers started together can race for their
    torch.distributed ports) is started again, as a sweep does (server.start_ready)."""
    from ddtree_bench.sweep.server import start_ready

    servers = {}
    try:
        for name, start in starters.items():
            servers[name] = start()
        for name, start in starters.items():
            first = [servers[name]]   # started above: start_ready waits for it, and makes a new one only on a clash
            servers[name] = start_ready(lambda: first.pop() if first else start())
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


def pids_with_port(port: int) -> list[int]:
    """Processes whose command line has `--port PORT` (a server a sweep launched)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--port" in argv and argv[argv.index(b"--port") + 1:argv.index(b"--port") + 2] == [str(port).encode()]:
            out.append(int(d.name))
    return out


def generation_tokens(port: int, metric: str) -> float:
    """The server's generated-token counter (Prometheus `metric` summed) on 127.0.0.1:PORT; 0 when unreadable."""
    from ddtree_bench.sweep import counters as C
    from ddtree_bench.sweep.server import http_get

    status, body, _ = http_get(f"http://127.0.0.1:{port}/metrics", 2.0)
    if status != 200:
        return 0.0
    return C.metric_sum(C.parse_prometheus(body.decode()), metric) or 0.0


@dataclass
class KilledSweep:
    """A sweep whose first (AR) server was SIGKILLed mid-point: exit code, its output, the killed server's port."""
    rc: int
    log: str
    port: int | None


def sweep_killing_the_ar_server(cmd: list[str], engine: str, metric: str, env: dict, cwd: Path,
                                warm_tokens: float = 16, timeout_s: float = 900) -> KilledSweep:
    """Run the sweep `cmd` (a child process); when it starts `engine`'s AR server, wait until that server has
    generated more than `warm_tokens` (past the warmup: a measured request is in flight or done), kill the
    server's whole process group, and let the sweep go on to its end."""
    sweep = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
    lines, killed = [], None
    try:
        for line in sweep.stdout:
            lines.append(line)
            if killed is None and f"starting {engine} server for {engine} ar on port" in line:
                port = int(line.split(" on port ")[1].split()[0])
                deadline = time.monotonic() + timeout_s
                while generation_tokens(port, metric) <= warm_tokens and time.monotonic() < deadline:
                    time.sleep(0.2)
                for pid in pids_with_port(port):
                    os.killpg(os.getpgid(pid), signal.SIGKILL)   # the whole server, mid-point
                killed = port
        rc = sweep.wait(timeout=timeout_s)
    finally:
        if sweep.poll() is None:
            sweep.kill()
    return KilledSweep(rc, "".join(lines), killed)


@dataclass
class KilledPoint:
    """What `assert_the_killed_point_failed_alone` read: summary.csv's rows by method, the DFlash point's
    directory, its server.json and counters.json."""
    rows: dict[str, dict]
    dflash_dir: Path
    server: dict
    counters: dict


def assert_the_killed_point_failed_alone(killed: KilledSweep, out: Path, ddtree_pr: str) -> KilledPoint:
    """After `sweep_killing_the_ar_server` over ar / dflash / ddtree: exit 1 (one point failed, the sweep went
    on), no process left on the killed port, AR failed naming the server, DFlash ok with its server files and
    a counters cross-check that agrees, DDTree unsupported naming the engine's open PR."""
    assert killed.port is not None, killed.log
    assert killed.rc == 1, killed.log
    assert not pids_with_port(killed.port)
    rows = {r["method"]: r for r in csv.DictReader((out / "summary.csv").open())}
    assert "ar" in rows, killed.log
    assert rows["ar"]["status"] == "failed" and "server" in rows["ar"]["error"], rows["ar"]
    assert rows["dflash"]["status"] == "ok" and float(rows["dflash"]["acceptance_length_mean"]) > 1.5
    assert rows["ddtree"]["status"] == "unsupported" and ddtree_pr in rows["ddtree"]["error"]
    dflash_dir = out / "points" / rows["dflash"]["point_id"]
    for name in ("server.json", "metrics_before.prom", "metrics_after.prom", "counters.json", "server.log"):
        assert (dflash_dir / name).is_file(), name
    counters = json.loads((dflash_dir / "counters.json").read_text())
    assert counters["crosscheck"]["agree"] is True
    return KilledPoint(rows, dflash_dir, json.loads((dflash_dir / "server.json").read_text()), counters)


def assert_resume_reruns_only_the_failed_point(resumed: subprocess.CompletedProcess, out: Path, engine: str,
                                               dflash_records: bytes, dflash_dir: Path) -> dict[str, dict]:
    """After `sweep --resume` (resumed) of a sweep whose AR point failed: exit 0, only the AR server started
    again, AR and DFlash ok, DDTree still unsupported, the finished DFlash point's records untouched.
    Returns summary.csv's rows by method."""
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"starting {engine} server for {engine} ar" in resumed.stdout
    assert f"starting {engine} server for {engine} dflash" not in resumed.stdout
    rows = {r["method"]: r for r in csv.DictReader((out / "summary.csv").open())}
    assert rows["ar"]["status"] == "ok" and rows["dflash"]["status"] == "ok" and rows["ddtree"]["status"] == "unsupported"
    assert (dflash_dir / "records.jsonl").read_bytes() == dflash_records   # a finished point is never rerun
    assert float(rows["dflash"]["speedup_vs_ar"]) > 0
    return rows
