"""The sweep-directory lock: one driver process writes a sweep directory, for the sweep's whole life.

`SweepLock(dir).acquire()` takes an exclusive, non-blocking `flock` on `DIR/.sweep.lock` and writes
the holder into it (pid, host, start time, command). Only the sweep's driver process holds it;
workers and servers never write the sweep directory. A second `sweep --out DIR` or `--resume DIR`
while it is held is a UsageError (exit 2) naming the holder.

Stale locks: the kernel drops a flock when its holder dies, however it dies (SIGKILL included). A
lock file whose flock is free but which still names a holder therefore belongs to a driver that
died without releasing it; the next driver takes it over and says so (`taken_over` holds the dead
holder's record). `release()` removes the file while still holding the flock, and `acquire()`
re-checks that the file it locked is the one at the path (a racing unlink cannot hand two drivers
the lock). On a file system without flock the lock degrades to a warning, never to a crash.

Knows nothing of grids, servers or results.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable

from ddtree_bench.env import now_iso
from ddtree_bench.errors import UsageError

LOCK_NAME = ".sweep.lock"


def describe_holder(h: dict[str, Any] | None) -> str:
    if not h:
        return "another process (it has not written its details yet)"
    return f"pid {h.get('pid')} on {h.get('host')}, started {h.get('started_at')}"


class SweepLock:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.path = self.root / LOCK_NAME
        self.fd: int | None = None
        self.taken_over: dict[str, Any] | None = None   # the dead holder's record, when a stale lock was taken over

    @staticmethod
    def _read(fd: int) -> dict[str, Any] | None:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            data = os.read(fd, 65536)
            obj = json.loads(data.decode("utf-8")) if data.strip() else None
            return obj if isinstance(obj, dict) else None
        except (OSError, ValueError):
            return None

    def acquire(self, warn: Callable[[str], None] | None = None) -> "SweepLock":
        import fcntl

        for _ in range(20):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = None
                for _ in range(10):  # the holder writes its record right after it locks
                    holder = self._read(fd)
                    if holder:
                        break
                    time.sleep(0.05)
                os.close(fd)
                raise UsageError(f"{self.root} is in use by another sweep: {describe_holder(holder)}",
                                 hint="wait for it to finish (or stop it); one sweep at a time per directory") from None
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                    if warn:
                        warn(f"warning: {self.root}: this file system cannot lock files; two sweeps on it would collide")
                    return self
                raise UsageError(f"cannot lock {self.path}: {e.strerror or e}") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # released and removed between our open and our flock: try the new file
                os.close(fd)
                continue
            self.fd = fd
            break
        else:  # pragma: no cover - twenty lost races in a row
            raise UsageError(f"cannot lock {self.path}: it keeps being replaced")
        prev = self._read(self.fd)
        if prev and prev.get("pid") != os.getpid():
            self.taken_over = prev
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": now_iso(), "command": sys.argv}
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        os.write(self.fd, (json.dumps(record) + "\n").encode("utf-8"))
        return self

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(self.fd)  # closing drops the flock
        self.fd = None

    def __enter__(self) -> "SweepLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()
