"""`ServerProcess`: one inference server as a child process group, from launch to a clean kill.

* start: the command runs as the leader of its own session / process group
  (`start_new_session=True`), stdout and stderr appended to a log file, stdin closed;
* ready: poll `health_path` with short per-request timeouts (a port can accept connections long
  before the engine answers: vLLM binds early, SGLang answers 503 while loading) until HTTP 200;
  an early exit of the process is detected at once and reported with the tail of its log;
* stop: SIGTERM to the whole group, SIGKILL after a grace period, then reap; also run on errors,
  Ctrl-C (the `with` block), SIGTERM to the sweep (see `sweep.run`) and interpreter exit (atexit),
  so no server or grandchild outlives the sweep.
* a SIGKILLed launcher: on Linux the server's leader is started with PR_SET_PDEATHSIG = SIGKILL
  (`preexec_fn`), so it dies with the thread that launched it (the sweep's main thread) even when
  nothing in that process could run; the group is still its own. A watchdog process (own session,
  blocked on a pipe only the launcher can write) sees the launcher's death as EOF and kills the
  whole group, grandchildren included. Should both fail, `record_dir` keeps one `<log>.pid.json`
  per live server (pid = pgid,
  host, boot id, the kernel's start time of the pid) and `reap_recorded(dir)` - run by
  `sweep --resume` - kills a recorded group only after checking that it is that same process
  (same boot, same start time; or the leader gone but its group still alive, which Linux never
  lets a new process join), so a pid reused by an unrelated process is never signalled.

`free_port()` picks a free TCP port on the host, at random from `D.SERVER_PORTS`: below the kernel's ephemeral
range, where every other process's bind to port 0 lands (in CI on 2026-12-07 a listener of another process took an
SGLang server's ephemeral port while it loaded: it accepted connections and never answered), and below SGLang's own
torch.distributed ports (22000-29999, drawn below the ephemeral range for the same reason: sglang 0.5.23,
`srt/utils/network.py`). A port free when it was picked can still be taken before the server binds it (by another
server starting at the same moment, or a host whose ephemeral range covers ours, where it falls back to port 0):
`port_clash(err)` tells such a failed start from the others by its log, and callers start it again on fresh ports
(`D.SERVER_PORT_CLASH_RETRIES` times). `wait_ready` reads the log as it grows: a clash line that names the server's
own port ends the wait at once, even after clashes on other ports, since the server cannot be ready there (SGLang's
uvicorn logs the lost port and the process stays up, unserved, until its own warmup gives up 12 minutes later); the
clash line (its own port's, else the first), wherever it stands in the log, heads the error's tail, so `port_clash`
sees it however much the server printed after it.
Knows nothing of profiles, grids or results.
"""

from __future__ import annotations

import atexit
import http.client
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from typing import Any, Callable, NoReturn

from ddtree_bench import defaults as D

_LIVE: "weakref.WeakSet[ServerProcess]" = weakref.WeakSet()


class ServerError(RuntimeError):
    """The server could not be started or died; `log_tail` holds the end of its log."""

    def __init__(self, message: str, log_tail: str = ""):
        super().__init__(message)
        self.log_tail = log_tail

    def full(self) -> str:
        return f"{self}\n--- server log (tail) ---\n{self.log_tail}" if self.log_tail else str(self)


# what Python, uvicorn, torch.distributed (c10d's EADDRINUSE), ZMQ and llama.cpp print when a port they bind is taken
_PORT_CLASH = re.compile(r"address already in use|EADDRINUSE|\[Errno 98\]|couldn't bind HTTP server socket", re.I)


def clash_names_port(line: str, port: int) -> bool:
    """Whether a port-clash line names `port` (as a whole number: 8000 is not in 18000)."""
    return re.search(rf"(?<!\d){port}(?!\d)", line) is not None


def port_clash(err: ServerError) -> bool:
    """Whether a server failed to start because a port it was to bind was taken by then (its log tail says so): a race
    that a start on fresh ports does not repeat, unlike a bad flag or a model that does not load."""
    return bool(_PORT_CLASH.search(err.log_tail or ""))


def ephemeral_ports(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int] | None:
    """The kernel's range for binds to port 0 and outgoing connections (Linux), or None where it cannot be read."""
    try:
        lo, hi = (int(x) for x in Path(path).read_text().split())
    except (OSError, ValueError):
        return None
    return lo, hi


def port_range(ephemeral: tuple[int, int] | None) -> tuple[int, int] | None:
    """`D.SERVER_PORTS` cut to what lies below the ephemeral range (None: nothing does; no range known: as it is)."""
    lo, hi = D.SERVER_PORTS
    if ephemeral is not None:
        hi = min(hi, ephemeral[0] - 1)
    return (lo, hi) if lo <= hi else None


def free_port(host: str = "127.0.0.1", tries: int = 64) -> int:
    """A TCP port that was free a moment ago: one of `port_range` that binds (released at once), else what a bind
    to port 0 gives."""
    span = port_range(ephemeral_ports())
    draw = random.SystemRandom()   # not the process's seeded generator: forked workers draw apart
    for _ in range(tries if span else 0):
        port = draw.randint(*span)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def http_get(url: str, timeout_s: float, api_key: str | None = None) -> tuple[int | None, bytes, str | None]:
    """(status, body, error) of one GET; status None when no HTTP answer came back."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, r.read(), None
    except urllib.error.HTTPError as e:
        try:
            body = e.read()
        except Exception:
            body = b""
        return e.code, body, f"HTTP {e.code}"
    except (urllib.error.URLError, OSError, TimeoutError, http.client.HTTPException) as e:
        # HTTPException: a server that dies mid-answer (IncompleteRead, a bad status line) is no answer either
        reason = getattr(e, "reason", e)
        return None, b"", f"{type(reason).__name__}: {reason}"


class ServerProcess:
    """with ServerProcess(argv, port=..., log_path=...) as srv: ... srv.url ...  (killed on exit)"""

    def __init__(self, argv: list[str], *, port: int, log_path: Path, host: str = D.HOST,
                 health_path: str = "/health", env: dict[str, str] | None = None,
                 startup_timeout_s: float = D.SERVER_STARTUP_TIMEOUT_S, poll_interval_s: float = D.SERVER_POLL_INTERVAL_S,
                 request_timeout_s: float = D.SERVER_HEALTH_TIMEOUT_S, grace_s: float = D.SERVER_STOP_GRACE_S,
                 api_key: str | None = None):
        self.argv = [str(a) for a in argv]
        self.host, self.port = host, port
        self.log_path = Path(log_path)
        self.health_path = health_path
        self.env = dict(env or {})
        self.startup_timeout_s = startup_timeout_s
        self.poll_interval_s = poll_interval_s
        self.request_timeout_s = request_timeout_s
        self.grace_s = grace_s
        self.api_key = api_key
        self.proc: subprocess.Popen | None = None
        self.record_dir: Path | None = None   # where start() records pid/start time (sweep dir servers/)
        self._record: Path | None = None
        self._watchdog: tuple[subprocess.Popen, int] | None = None   # (process, write end of its pipe)
        self._log = None
        self._log_start = 0
        self._scanned_to = 0                   # log offset read so far for a port clash
        self._clash_line: str | None = None    # this start's first clash line (its own port's, once seen)
        self.started_at: float | None = None
        self.ready_after_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    # ----------------------------------------------------------------------- lifecycle

    def start(self) -> "ServerProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self._log_start = self._log.tell()   # log_tail reads this start's lines only (a retry appends to the same log)
        self._log.write(f"$ {' '.join(self.argv)}\n".encode())
        self._log.flush()
        self._scanned_to, self._clash_line = self._log.tell(), None
        try:
            self.proc = subprocess.Popen(
                self.argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env}, start_new_session=True, close_fds=True,
                preexec_fn=_die_with_parent(),
            )
        except OSError as e:
            self._log.close()
            raise ServerError(f"cannot start {self.argv[0]!r}: {e.strerror or e}") from None
        self.started_at = time.monotonic()
        _LIVE.add(self)
        self._watchdog = _start_watchdog(self.proc.pid, self.grace_s)
        if self.record_dir is not None:
            self._record = write_record(self.record_dir / f"{self.log_path.stem}.pid.json", self.proc.pid, self.argv)
        return self

    def wait_ready(self) -> "ServerProcess":
        """Poll the health endpoint until 200; raise ServerError on early exit or timeout (server stopped)."""
        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + self.startup_timeout_s
        last = "no answer yet"
        while True:
            rc = self.proc.poll()
            if rc is not None:
                self._scan_for_clash(final=True)
                self._fail(f"server exited with code {rc} before it was ready ({self.argv[0]})")
            status, _, err = http_get(self.url + self.health_path, self.request_timeout_s, self.api_key)
            if status == 200:
                self.ready_after_s = time.monotonic() - (self.started_at or time.monotonic())
                return self
            last = err or f"HTTP {status}"
            if self._scan_for_clash():
                self._fail(f"port {self.port} was taken before the server could bind it ({self.argv[0]})")
            if time.monotonic() >= deadline:
                self._fail(f"server not ready after {self.startup_timeout_s:g} s (GET {self.health_path}: {last})")
            time.sleep(self.poll_interval_s)

    def _fail(self, message: str) -> NoReturn:
        """Stop the server and raise ServerError with its log tail, headed by a clash line the tail would miss."""
        tail = self.log_tail()
        if self._clash_line is not None and self._clash_line not in tail:
            tail = f"{self._clash_line}\n[...]\n{tail}"
        self.stop()
        raise ServerError(message, tail)

    def _scan_for_clash(self, final: bool = False) -> bool:
        """Read the log's new whole lines (and a last unfinished one when `final`: the process has exited) for lines
        that say a port was taken: remember the first, or the first that names this server's own port once one does.
        Returns whether one has (the server cannot become ready there)."""
        if self._clash_line is not None and clash_names_port(self._clash_line, self.port):
            return True
        chunk = self.log_slice(self._scanned_to)
        whole = chunk if final else chunk[:chunk.rfind(b"\n") + 1]
        self._scanned_to += len(whole)
        for line in whole.decode("utf-8", errors="replace").splitlines():
            if _PORT_CLASH.search(line):
                own = clash_names_port(line, self.port)
                if self._clash_line is None or own:
                    self._clash_line = line.strip()
                if own:
                    return True
        return False

    def alive(self, settle_s: float = 0.0) -> bool:
        """Is the server process still running? With settle_s, a process that is dying gets that long
        to finish: a SIGKILLed server closes its sockets (its clients see broken streams) before the
        kernel has torn down gigabytes of memory and made it a zombie, so an instant poll can still
        call it alive."""
        if self.proc is None:
            return False
        if settle_s > 0:
            try:
                self.proc.wait(timeout=settle_s)
            except subprocess.TimeoutExpired:
                return True
        return self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc else None

    @staticmethod
    def _group_alive(pgid: int) -> bool:
        """Does any non-zombie process remain in the group? (/proc on Linux; killpg(0) elsewhere, which
        also counts zombies that nobody has reaped yet.)"""
        proc = Path("/proc")
        if proc.is_dir():
            for d in proc.iterdir():
                if not d.name.isdigit():
                    continue
                try:
                    fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
                except (OSError, IndexError):
                    continue
                if len(fields) > 2 and fields[0] != "Z" and fields[2] == str(pgid):
                    return True
            return False
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True

    def stop(self) -> int | None:
        """SIGTERM the process group, SIGKILL it after `grace_s`, reap the leader. Idempotent."""
        proc = self.proc
        if proc is None:
            return None
        pgid = proc.pid  # leader of its own session: pgid == pid
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline:
            if proc.poll() is not None and not self._group_alive(pgid):
                break
            time.sleep(0.05)
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=self.grace_s)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
            pass
        # grandchildren were re-parented when the leader died; give init a moment to reap them
        end = time.monotonic() + 2.0
        while self._group_alive(pgid) and time.monotonic() < end:
            time.sleep(0.05)
        if self._log is not None and not self._log.closed:
            self._log.close()
        if self._record is not None:
            self._record.unlink(missing_ok=True)
            self._record = None
        _stop_watchdog(self._watchdog)
        self._watchdog = None
        _LIVE.discard(self)
        return proc.returncode

    # ----------------------------------------------------------------------- logs

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_tail(self, lines: int = 40, max_bytes: int = 16384) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(self._log_start, self.log_size() - max_bytes))
                text = f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def log_slice(self, start: int, end: int | None = None) -> bytes:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(start)
                return f.read() if end is None else f.read(max(0, end - start))
        except OSError:
            return b""

    def describe(self) -> dict[str, Any]:
        return {"url": self.url, "pid": self.pid, "log": str(self.log_path), "health_path": self.health_path,
                "ready_after_s": self.ready_after_s}

    def __enter__(self) -> "ServerProcess":
        """Start (unless started already: `with start_ready(make) as srv:` takes the ready server as it is), wait until
        ready; stopped on leaving the block."""
        if self.proc is None:
            self.start()
        try:
            return self.wait_ready() if self.ready_after_s is None else self
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def start_ready(make: Callable[[], ServerProcess], retries: int = D.SERVER_PORT_CLASH_RETRIES) -> ServerProcess:
    """`make()` a server (on ports it picks itself), start it (unless make started it) and wait until it is ready; when
    it failed only because a port was taken meanwhile (port_clash), stop it and do it all again with a new `make()`, up
    to `retries` times. Returns the ready server; raises the last ServerError (the failed server stopped)."""
    clashes = 0
    while True:
        srv = make()
        try:
            if srv.proc is None:
                srv.start()
            return srv.wait_ready()
        except BaseException as e:   # Ctrl-C while it loads too: nothing is left running
            srv.stop()
            if clashes >= retries or not (isinstance(e, ServerError) and port_clash(e)):
                raise
            clashes += 1


# --------------------------------------------------------------------------- dying with the launcher


def _die_with_parent():
    """preexec_fn for Linux: SIGKILL this child when the launching thread dies (PR_SET_PDEATHSIG);
    None elsewhere. If the launcher died before prctl took effect, the child exits at once."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


PR_SET_PDEATHSIG = 1
_WATCHDOG = """
import os, sys
from ddtree_bench.sweep.server import _watchdog_main
_watchdog_main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
"""


def _start_watchdog(pgid: int, grace_s: float) -> tuple[subprocess.Popen, int] | None:
    """A tiny process in its own session that kills the server's whole group (grandchildren included)
    when the launcher dies: it blocks reading a pipe whose only write end the launcher holds, so any
    death of the launcher (SIGKILL too) is an EOF. `stop()` writes "stop" first, so a normal stop
    never signals a group that is gone. Linux only (it needs /proc to recognise the group)."""
    if not sys.platform.startswith("linux"):
        return None
    st = _proc_stat(pgid)
    if st is None:
        return None
    r, w = os.pipe()  # both ends non-inheritable: the server never holds the write end
    try:
        proc = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(pgid), str(st[2]), str(grace_s)], stdin=r,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    except OSError:
        os.close(w)
        return None
    finally:
        os.close(r)
    return proc, w


def _stop_watchdog(wd: tuple[subprocess.Popen, int] | None) -> None:
    if wd is None:
        return
    proc, w = wd
    try:
        os.write(w, b"stop\n")
    except OSError:
        pass
    os.close(w)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover
        proc.kill()


def _watchdog_main(pgid: int, ticks: int, grace_s: float) -> None:
    """Body of the watchdog process: wait for "stop" or EOF on stdin; on EOF kill the group if it is
    still the one we were given (the leader's start time matches, or the leader is gone and the group
    lives on, which no new process can join)."""
    data = b""
    try:
        while True:
            chunk = os.read(0, 64)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    if b"stop" in data:
        return
    leader = _proc_stat(pgid)
    if (leader is not None and leader[2] == ticks) or (leader is None and _group_members(pgid)):
        _kill_group(pgid, grace_s)


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, pgid, start time in clock ticks since boot) of a pid, from /proc; None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    try:
        return fields[0], int(fields[2]), int(fields[19])
    except (IndexError, ValueError):
        return None


def write_record(path: Path, pid: int, argv: list[str]) -> Path:
    """Record a launched server (pid = its pgid) so a later `--resume` can reap it if we die."""
    from ddtree_bench.outpaths import atomic_write_text

    st = _proc_stat(pid)
    rec = {"pid": pid, "pgid": pid, "host": socket.gethostname(), "boot_id": _boot_id(),
           "start_ticks": st[2] if st else None, "argv": argv, "launcher_pid": os.getpid()}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(rec) + "\n")
    return path


def _group_members(pgid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if d.name.isdigit():
            st = _proc_stat(int(d.name))
            if st is not None and st[0] != "Z" and st[1] == pgid:
                out.append(int(d.name))
    return out


def reap_recorded(record_dir: Path, echo=print, grace_s: float = D.SERVER_STOP_GRACE_S) -> list[int]:
    """Kill the servers recorded in `record_dir` that are still the processes we launched; remove
    every record. Returns the pgids killed. Records of another host are left alone (and kept)."""
    killed = []
    for rec_path in sorted(Path(record_dir).glob("*.pid.json")) if Path(record_dir).is_dir() else []:
        try:
            rec = json.loads(rec_path.read_text(encoding="utf-8"))
            pgid, ticks = int(rec["pgid"]), rec.get("start_ticks")
        except (OSError, ValueError, KeyError, TypeError):
            rec_path.unlink(missing_ok=True)
            continue
        if rec.get("host") != socket.gethostname():
            echo(f"note: {rec_path.name}: a server recorded on host {rec.get('host')} (pid {pgid}); not checked from here")
            continue
        same_boot = rec.get("boot_id") is None or rec.get("boot_id") == _boot_id()
        leader = _proc_stat(pgid)
        ours = False
        if same_boot and leader is not None:
            ours = ticks is not None and leader[2] == ticks and leader[1] == pgid
        elif same_boot and leader is None:
            ours = bool(_group_members(pgid))  # the group outlived its leader: nobody new can join it
        if ours:
            echo(f"stopping a server left running by an earlier sweep (pid {pgid}: {' '.join(rec.get('argv') or [])[:120]})")
            _kill_group(pgid, grace_s)
            killed.append(pgid)
        rec_path.unlink(missing_ok=True)
    return killed


def _kill_group(pgid: int, grace_s: float) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    end = time.monotonic() + grace_s
    while time.monotonic() < end and _group_members(pgid):
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    end = time.monotonic() + 2.0
    while time.monotonic() < end and _group_members(pgid):
        time.sleep(0.05)


@atexit.register
def _stop_all() -> None:  # last line of defence: never leave a server behind
    for srv in list(_LIVE):
        try:
            srv.stop()
        except Exception:
            pass
