"""Test helpers for the HTTP side: an aiohttp app served from a background thread, a
`ddtree-bench serve` subprocess, and small fake servers that misbehave on purpose.

The threaded server has its own event loop, so test code may drive it with `asyncio.run(...)`,
`runner.execute(...)` or plain sockets from the main thread.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from aiohttp import web


class ThreadedServer:
    """Serve `app` on 127.0.0.1:<free port> from a daemon thread. `stop()` closes it (connections too)."""

    def __init__(self, app: web.Application):
        self.app = app
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runner: web.AppRunner | None = None
        self.url = ""

    def __enter__(self) -> "ThreadedServer":
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=30)
        return self

    async def _start(self) -> None:
        self.runner = web.AppRunner(self.app, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    def stop(self) -> None:
        if self.runner is not None:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=30)
            self.runner = None

    def __exit__(self, *exc) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


class ServeProcess:
    """`ddtree-bench serve ARGS --port 0` as a subprocess; `url` from its ready line."""

    def __init__(self, *args: str, startup_timeout_s: float = 120.0):
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")  # 2 shared cores: no oversubscription
        self.proc = subprocess.Popen([sys.executable, "-m", "ddtree_bench", "serve", *args, "--port", "0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.startup_timeout_s = startup_timeout_s
        self.url = ""

    def wait_ready(self) -> "ServeProcess":
        deadline = time.time() + self.startup_timeout_s
        out: list[str] = []

        def read() -> None:
            out.append(self.proc.stdout.readline())

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(timeout=max(0.0, deadline - time.time()))
        line = out[0] if out else ""
        m = re.search(r"ready at (http://\S+)", line)
        if not m:
            self.kill()
            raise RuntimeError(f"server did not become ready: {line!r} {self.proc.stderr.read()[-2000:]}")
        self.url = m.group(1)
        return self

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)

    def terminate(self, timeout_s: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(timeout=timeout_s)

    def stderr(self) -> str:
        return self.proc.stderr.read() if self.proc.poll() is not None else ""


def sse(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def write_suite(path: Path, prompts: list[tuple[str, list[str]]]) -> Path:
    path.write_text("".join(json.dumps({"id": pid, "turns": turns}) + "\n" for pid, turns in prompts), encoding="utf-8")
    return path
