"""Executors: where a sweep's batches run. The driver keeps the sweep directory; workers never touch it.

A batch (`sweep/order.py`) is one server group or one in-process engine's points; batches share
nothing, so they may run at once. Three executors:

* serial (`--workers 1`, the default): `executor_choice.make_executor` returns None and
  `sweep/loop.py` runs every batch in the driver process, as it always did;
* local (`--workers N`): up to N batches at once, each in its own worker process on this host
  (`multiprocessing` spawn; a worker loads its own model pair or starts its own server);
* ray (`--executor ray`): one Ray task per batch, anywhere in a cluster (`sweep/ray_executor.py`).

The unit of work is `run_group(job, emit)`: it runs the job's points with the sweep loop's own code
(`loop.SweepLoop.run_inprocess` / `run_server_group`) into a scratch directory named like the sweep (so
run.json names the real sweep id), and emits, per finished point, every file of its point directory
as bytes (`PointResult`), then `GroupDone`. The driver writes each point directory into the sweep
directory whole (staged under `points/.<id>.incoming-*`, then renamed), rewrites the scratch path
to the sweep path inside its JSON, and calls the loop's own `_finish` (summary.csv row, progress).
So the files are those of a serial run; only timings, ports and a `worker` record in status.json
differ (`pin_record`: host, pid, CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS and the CPU affinity the
process really has, and its server's).

Pinning (local): `assign_slots` gives worker i its own `gpus_per_point` devices out of the visible
ones (CUDA_VISIBLE_DEVICES of the driver, else torch's device count) and its own contiguous share
of the driver's CPU cores (`os.sched_setaffinity`; OMP_NUM_THREADS / MKL_NUM_THREADS = the share's
size), set in the worker before anything imports torch; servers inherit both. Ports come from
`free_port`, which never hands out a port that is bound; each worker's messages and stdout/stderr go
to `workers/worker-<i>.log`, written by the driver. A worker that dies (killed, OOM) fails the
points it had not reported, with the reason, and `--resume` runs them again. Ctrl-C / SIGTERM:
every worker gets SIGTERM (its loop stops its server, as in a serial sweep), SIGKILL after
`D.SWEEP_WORKER_STOP_GRACE_S`; a SIGKILLed driver takes its workers with it (PR_SET_PDEATHSIG), and
their servers follow (`sweep/server.py`).

Knows batches, points and processes; nothing of engines, HTTP or metrics.
"""

from __future__ import annotations

import os
import pickle
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from ddtree_bench import defaults as D
from ddtree_bench.errors import UsageError
from ddtree_bench.sweep.grid import GridSpec, Point
from ddtree_bench.sweep.layout import SweepDir


# --------------------------------------------------------------------------- what travels


@dataclass
class Slot:
    """What one local worker owns: GPU ids (CUDA_VISIBLE_DEVICES entries) and CPU cores."""

    index: int
    devices: list[str] = field(default_factory=list)
    cores: list[int] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.devices:
            out["CUDA_VISIBLE_DEVICES"] = ",".join(self.devices)
        if self.cores:
            out["OMP_NUM_THREADS"] = out["MKL_NUM_THREADS"] = str(len(self.cores))
        return out

    def describe(self) -> str:
        gpus = f"GPUs {','.join(self.devices)}" if self.devices else "no GPU pinned"
        return f"worker {self.index}: {gpus}, cores {_ranges(self.cores) if self.cores else 'all'}"


@dataclass
class GroupJob:
    """One batch to run elsewhere: the grid, the driver's preparation (`prepare.Prepared`) and the points."""

    sweep_id: str
    grid: GridSpec
    prep: Any
    points: list[Point]
    executor: str = "local"
    slot: int | None = None


@dataclass
class PointResult:
    point_id: str
    files: dict[str, bytes]          # path inside the point directory -> content
    server_logs: dict[str, bytes]    # servers/<name>.log -> whole content so far
    scratch: str                     # the worker's scratch sweep root (rewritten to the sweep's)


@dataclass
class Message:
    text: str
    scratch: str = ""


@dataclass
class GroupDone:
    server_logs: dict[str, bytes]
    scratch: str
    worker_log: bytes = b""


# --------------------------------------------------------------------------- pinning


def visible_devices() -> list[str]:
    """GPU ids this host lets us use: CUDA_VISIBLE_DEVICES when set (any ids; tests use fake ones),
    else 0..torch.cuda.device_count()-1, else none."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:
        return []


def available_cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def needs_gpu(points: list[Point]) -> bool:
    return any(p.device.split(":", 1)[0] == "cuda" for p in points)


def assign_slots(workers: int, gpus_per_point: int, gpu_points: bool, devices: list[str], cores: list[int]) -> list[Slot]:
    """Worker i: devices[i*K:(i+1)*K] (when the host has workers*K of them; required when any point
    is on CUDA) and cores[i*C:(i+1)*C] with C = len(cores) // workers (one shared core each, round
    robin, when there are more workers than cores)."""
    need = workers * gpus_per_point
    if gpu_points and len(devices) < need:
        raise UsageError(f"--workers {workers} x --gpus-per-point {gpus_per_point} needs {need} GPUs; "
                         f"{len(devices)} visible ({','.join(devices) or 'none'})",
                         hint="lower --workers / --gpus-per-point, or set CUDA_VISIBLE_DEVICES to the GPUs to use")
    use = len(devices) >= need
    per = len(cores) // workers
    slots = []
    for i in range(workers):
        mine = cores[i * per:(i + 1) * per] if per else ([cores[i % len(cores)]] if cores else [])
        slots.append(Slot(i, devices[i * gpus_per_point:(i + 1) * gpus_per_point] if use else [], mine))
    return slots


def pin(slot: Slot) -> None:
    """Apply a slot to this process (before torch is imported): env, then the CPU affinity."""
    os.environ.update(slot.env())
    if slot.cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, slot.cores)


def pin_record(pid: int | None = None) -> dict[str, Any]:
    """What a process really runs with (this one, or a child such as a server): for status.json."""
    pid = pid or os.getpid()
    env: dict[str, str] = dict(os.environ) if pid == os.getpid() else _proc_env(pid)
    try:
        affinity = sorted(os.sched_getaffinity(pid))
    except (AttributeError, OSError):
        affinity = None
    return {"host": socket.gethostname(), "pid": pid, "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
            "omp_num_threads": env.get("OMP_NUM_THREADS"), "cpu_affinity": affinity}


def _proc_env(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


# --------------------------------------------------------------------------- the worker side


def _files(root: Path) -> dict[str, bytes]:
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()} if root.is_dir() else {}


def _server_logs(servers: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(servers.glob("*.log"))} if servers.is_dir() else {}


def run_group(job: GroupJob, emit: Callable[[Any], None], scratch_parent: str | None = None,
              worker: dict[str, Any] | None = None) -> None:
    """Run `job.points` (one batch) into a scratch sweep directory; emit a PointResult per point,
    Messages for the console, then GroupDone. The scratch directory is removed at the end."""
    from ddtree_bench.sweep.loop import SweepLoop

    root = Path(tempfile.mkdtemp(prefix="ddtree-sweep-worker-", dir=scratch_parent))
    scratch = root / job.sweep_id
    sdir = SweepDir(scratch)
    sdir.points_dir.mkdir(parents=True)
    sdir.servers_dir.mkdir()
    me = {"executor": job.executor, "slot": job.slot, **(worker or {}), **pin_record()}

    class GroupSweep(SweepLoop):
        def _finish(self, p: Point) -> None:
            status = self.sdir.read_point_json(p.id, "status.json")
            if status is not None:
                server = self.sdir.read_point_json(p.id, "server.json") or {}
                status["worker"] = {**me, "server": pin_record(server["pid"]) if server.get("pid") else None}
                self.sdir.write_point_json(p.id, "status.json", status)
            emit(PointResult(p.id, _files(self.sdir.point_dir(p.id)), _server_logs(self.sdir.servers_dir), str(scratch)))

        def _write(self, text: str) -> None:
            emit(Message(text, str(scratch)))

    sweep = GroupSweep(job.grid, job.prep, sdir, False, lambda t: emit(Message(t, str(scratch))))
    try:
        if job.points[0].backend == "inprocess":
            sweep.run_inprocess(job.points, {})
        else:
            sweep.run_server_group(job.points)
        emit(GroupDone(_server_logs(sdir.servers_dir), str(scratch)))
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------- the driver side


def _safe(rel: str) -> bool:
    p = Path(rel)
    return not p.is_absolute() and ".." not in p.parts and bool(p.parts)


def write_point(sdir: SweepDir, pid: str, files: dict[str, bytes], scratch: str) -> None:
    """Write a point directory reported by a worker into the sweep directory, as a whole: staged
    beside it, then renamed over any earlier attempt (a failed point's directory under --resume)."""
    token = secrets.token_hex(4)
    stage = sdir.points_dir / f".{pid}.incoming-{token}"
    stage.mkdir(parents=True)
    try:
        for rel, data in files.items():
            if not _safe(rel):
                continue
            if rel.endswith(".json") and scratch:
                data = data.replace(scratch.encode(), str(sdir.root).encode())
            path = stage / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        dest = sdir.point_dir(pid)
        if dest.exists():
            old = sdir.points_dir / f".{pid}.replaced-{token}"
            os.replace(dest, old)
            os.replace(stage, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(stage, dest)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def write_server_logs(sdir: SweepDir, logs: dict[str, bytes]) -> None:
    sdir.servers_dir.mkdir(parents=True, exist_ok=True)
    for name, data in logs.items():
        if not _safe(name) or "/" in name:
            continue
        tmp = sdir.servers_dir / f".{name}.tmp-{os.getpid()}"
        tmp.write_bytes(data)
        os.replace(tmp, sdir.servers_dir / name)


class Absorber:
    """The driver's half: turn a worker's events into the sweep directory's files and console lines."""

    def __init__(self, sweep: Any):
        self.sweep = sweep
        self.sdir: SweepDir = sweep.sdir
        self.by_id = {p.id: p for p in sweep.points}
        self.logs_dir = self.sdir.root / "workers"

    def worker_log(self, name: str, text: str | bytes) -> None:
        self.logs_dir.mkdir(exist_ok=True)
        with open(self.logs_dir / f"{name}.log", "ab") as f:
            f.write(text if isinstance(text, bytes) else (text + "\n").encode())

    def _local(self, text: str, scratch: str) -> str:
        return text.replace(scratch, str(self.sdir.root)) if scratch else text

    def event(self, ev: Any, remaining: dict[str, Point], log_name: str) -> bool:
        """Handle one event; True when the group is done."""
        if isinstance(ev, Message):
            text = self._local(ev.text, ev.scratch)
            self.worker_log(log_name, text)
            self.sweep._write(f"({log_name}) {text}")
        elif isinstance(ev, PointResult):
            write_point(self.sdir, ev.point_id, ev.files, ev.scratch)
            write_server_logs(self.sdir, ev.server_logs)
            p = remaining.pop(ev.point_id, None) or self.by_id[ev.point_id]
            self.sweep._finish(p)
        elif isinstance(ev, GroupDone):
            write_server_logs(self.sdir, ev.server_logs)
            if ev.worker_log:
                self.worker_log(log_name, ev.worker_log)
            self.lose(remaining, "the worker finished without reporting this point")
            return True
        return False

    def lose(self, remaining: dict[str, Point], why: str) -> None:
        """Points a lost worker never reported: failed (no summary.json), so --resume runs them."""
        for pid, p in list(remaining.items()):
            self.sdir.mark_failed(pid, why)
            self.sweep._finish(p)
            remaining.pop(pid, None)


class Executor(Protocol):
    name: str

    def describe(self) -> list[str]: ...

    def run(self, sweep: Any, batches: list) -> None: ...


# --------------------------------------------------------------------------- local processes


def _local_worker(token: int, slot: Slot, job_bytes: bytes, conn: Any, log_path: str) -> None:
    """Body of a local worker process: die with the driver, pin, redirect stdio, run the group."""
    _die_with_parent()
    signal.signal(signal.SIGTERM, _raise_interrupt)
    pin(slot)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    job: GroupJob = pickle.loads(job_bytes)  # after pin(): whatever this imports sees the slot's env

    def emit(ev: Any) -> None:
        if isinstance(ev, GroupDone):
            sys.stdout.flush()
            sys.stderr.flush()
            ev.worker_log = Path(log_path).read_bytes()
        conn.send((token, ev))

    try:
        run_group(job, emit, worker={"worker": slot.index, "pinned": slot.env(), "pinned_cores": slot.cores})
    except KeyboardInterrupt:
        os._exit(130)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@dataclass
class _Running:
    proc: Any
    conn: Any                  # the read end of this worker's own pipe
    slot: Slot
    remaining: dict[str, Point]
    log_path: Path


class LocalExecutor:
    """Up to len(slots) batches at once, each in a spawned worker process pinned to its slot. Each
    worker reports on its own pipe, so a worker killed in the middle of a message garbles only its
    own channel (read as "lost"), never another worker's."""

    name = "local"

    def __init__(self, slots: list[Slot]):
        self.slots = slots

    def describe(self) -> list[str]:
        return [s.describe() for s in self.slots]

    def run(self, sweep: Any, batches: list) -> None:
        import multiprocessing as mp
        from multiprocessing.connection import wait

        ctx = mp.get_context("spawn")
        absorb = Absorber(sweep)
        todo = deque(b for b in batches if any(not sweep.sdir.finished(p.id) for p in b.points))
        free = list(self.slots)
        running: dict[int, _Running] = {}
        tmp = Path(tempfile.mkdtemp(prefix="ddtree-sweep-driver-"))
        token = 0

        def release(tok: int, why: str | None) -> None:
            r = running.pop(tok)
            if why is not None:
                if r.log_path.exists():
                    absorb.worker_log(f"worker-{r.slot.index}", r.log_path.read_bytes())
                absorb.lose(r.remaining, why)
            r.conn.close()
            r.proc.join(timeout=D.SWEEP_WORKER_STOP_GRACE_S)
            free.append(r.slot)
            free.sort(key=lambda s: s.index)

        def lost_reason(r: _Running) -> str:
            r.proc.join(timeout=5)
            code = r.proc.exitcode
            return (f"worker process exited with code {code} before this point finished"
                    + (" (killed by a signal)" if code is not None and code < 0 else ""))

        try:
            while todo or running:
                while todo and free:
                    batch, slot = todo.popleft(), free.pop(0)
                    pts = [p for p in batch.points if not sweep.sdir.finished(p.id)]
                    token += 1
                    job = GroupJob(sweep.sdir.id, sweep.grid, sweep.prep, pts, "local", slot.index)
                    log = tmp / f"worker-{token}.log"
                    reader, writer = ctx.Pipe(duplex=False)
                    proc = ctx.Process(target=_local_worker, args=(token, slot, pickle.dumps(job), writer, str(log)),
                                       name=f"ddtree-sweep-worker-{slot.index}")
                    proc.start()
                    writer.close()  # the worker holds the only write end: its death is EOF here
                    running[token] = _Running(proc, reader, slot, {p.id: p for p in pts}, log)
                by_conn = {r.conn: tok for tok, r in running.items()}
                for conn in wait(list(by_conn), timeout=0.5):
                    tok = by_conn[conn]
                    r = running[tok]
                    try:
                        _, ev = conn.recv()
                    except (EOFError, OSError, pickle.UnpicklingError, AttributeError, ValueError):
                        release(tok, lost_reason(r))  # died (perhaps mid-message): what it had not reported fails
                        continue
                    if absorb.event(ev, r.remaining, f"worker-{r.slot.index}"):
                        release(tok, None)
        finally:
            self._stop(running)
            shutil.rmtree(tmp, ignore_errors=True)

    @staticmethod
    def _stop(running: dict[int, _Running]) -> None:
        """SIGTERM every live worker (each stops its server), SIGKILL what is left after the grace."""
        procs = [r.proc for r in running.values() if r.proc.is_alive()]
        for p in procs:
            p.terminate()
        end = time.monotonic() + D.SWEEP_WORKER_STOP_GRACE_S
        for p in procs:
            p.join(timeout=max(0.0, end - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


def _ranges(xs: list[int]) -> str:
    out, start, prev = [], None, None
    for x in xs:
        if start is None:
            start = prev = x
        elif x == prev + 1:
            prev = x
        else:
            out.append(f"{start}-{prev}" if start != prev else str(start))
            start = prev = x
    if start is not None:
        out.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(out)


def keep_execution(stored: GridSpec, given: GridSpec | None) -> GridSpec:
    """--resume: the stored grid, with where-to-run settings (`EXECUTION_KEYS`) of this invocation."""
    from ddtree_bench.sweep.grid import EXECUTION_KEYS

    if given is not None:
        for k in EXECUTION_KEYS:
            setattr(stored, k, getattr(given, k))
    return stored
