"""ServerProcess: readiness polling, early-exit detection with the log tail, and process-group kills
that leave no orphan (grandchildren included), also when the sweep itself gets SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ddtree_bench import defaults as D
from ddtree_bench.sweep.server import ServerError, ServerProcess, ephemeral_ports, free_port, http_get, port_clash, \
    port_range, start_ready

FAKE_SERVER = textwrap.dedent(r'''
    """A fake inference server. argv: MODE PORT PIDFILE. It starts a grandchild (`sleep`) in its
    process group and writes {"pid", "grandchild"} to PIDFILE.
    MODE: ready (health 200), crash (exit 3 at once), never (health 503 forever),
    stubborn (ready, ignores SIGTERM), hang (ready; POSTs never answer); and four that log a lost port, then 60
    lines: squatted (its own port, then stays up unserved: SGLang's uvicorn), clash-exit (another port, then
    SIGKILLs itself), clash-other (another port, then ready), clash-twice (another port, then its own, then stays
    up unserved)."""
    import json, os, signal, subprocess, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    mode, port, pidfile = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    child = subprocess.Popen(["sleep", "300"])
    with open(pidfile, "w") as f:
        json.dump({"pid": __import__("os").getpid(), "grandchild": child.pid}, f)
    print(f"fake server {mode} on {port}", flush=True)
    if mode == "crash":
        print("RuntimeError: CUDA out of memory (fake)", flush=True)
        sys.exit(3)
    if mode in ("squatted", "clash-exit", "clash-other", "clash-twice"):
        for lost in {"squatted": [port], "clash-twice": [port + 1, port]}.get(mode, [port + 1]):
            print(f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {lost}): "
                  "address already in use", flush=True)
            for i in range(60):
                print(f"warmup: GET /model_info timed out, retry {i}", flush=True)
        if mode in ("squatted", "clash-twice"):
            time.sleep(300)
        if mode == "clash-exit":
            os.kill(os.getpid(), signal.SIGKILL)
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, lambda *a: print("ignoring SIGTERM", flush=True))

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            ok = self.path in ("/health", "/version", "/v1/models") and mode != "never"
            body = json.dumps({"version": "fake-1"} if self.path == "/version" else
                              {"object": "list", "data": [{"id": "random"}]} if self.path == "/v1/models" else {}).encode()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            time.sleep(300)

    ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
''')


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def wait_file(path: Path, timeout_s: float = 20.0) -> dict:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if path.exists() and path.stat().st_size:
            try:
                return json.loads(path.read_text())
            except json.JSONDecodeError:
                pass
        time.sleep(0.05)
    raise AssertionError(f"{path} was not written")


@pytest.fixture
def fake(tmp_path):
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    return script


def _server(fake, tmp_path, mode, **kw):
    port = free_port()
    pidfile = tmp_path / f"{mode}.pid.json"
    srv = ServerProcess([sys.executable, str(fake), mode, str(port), str(pidfile)], port=port,
                        log_path=tmp_path / f"{mode}.log", poll_interval_s=0.1, request_timeout_s=1.0, **kw)
    return srv, pidfile


def test_ready_server_is_killed_with_its_grandchild_even_if_it_ignores_sigterm(fake, tmp_path):
    srv, pidfile = _server(fake, tmp_path, "stubborn", grace_s=0.5)
    with srv:
        assert srv.alive()
        status, body, _ = http_get(srv.url + "/version", 2.0)
        assert status == 200 and json.loads(body) == {"version": "fake-1"}
        pids = wait_file(pidfile)
        assert os.getpgid(pids["grandchild"]) == srv.pid  # the grandchild is in the server's process group
        assert os.getpgid(srv.pid) != os.getpgid(0)       # ... which is not ours (Ctrl-C goes to us only)
    assert not alive(pids["pid"]) and not alive(pids["grandchild"])
    assert "ignoring SIGTERM" in srv.log_path.read_text()  # SIGTERM first, SIGKILL after the grace period
    assert srv.stop() is not None  # idempotent


@pytest.mark.parametrize("answer", [b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial", b"HTTP/1.1 2"],
                         ids=["cut-body", "cut-status-line"])
def test_a_server_dying_mid_answer_is_no_answer_not_an_exception(answer):
    """http_get (the sweep's /metrics and /server_info scrapes around every server point) against a server killed
    while it answers: status None and the reason, not an exception. (Escaping, it ends the whole sweep as an internal
    error with no point recorded - the likely cause of one failure of tests/backends/test_sglang_live.py's
    killed-server test in CI on 2026-12-04: exit 1, an empty summary, the server log ending at the scrape.)"""
    import socket
    import threading

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)

    def serve():
        conn, _ = sock.accept()
        conn.recv(4096)
        conn.sendall(answer)
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    status, body, err = http_get(f"http://127.0.0.1:{sock.getsockname()[1]}/metrics", 2.0)
    sock.close()
    assert status is None and body == b"" and err


def test_early_exit_is_reported_with_the_log_tail(fake, tmp_path):
    srv, pidfile = _server(fake, tmp_path, "crash", startup_timeout_s=30)
    t0 = time.monotonic()
    with pytest.raises(ServerError) as e:
        with srv:
            pass
    assert time.monotonic() - t0 < 15  # detected at once, not after the startup timeout
    assert "exited with code 3 before it was ready" in str(e.value)
    assert "CUDA out of memory (fake)" in e.value.log_tail and "CUDA out of memory" in e.value.full()
    assert not alive(wait_file(pidfile)["grandchild"])


def test_a_server_that_never_becomes_ready_times_out_and_is_killed(fake, tmp_path):
    srv, pidfile = _server(fake, tmp_path, "never", startup_timeout_s=2.0, grace_s=0.5)
    with pytest.raises(ServerError, match=r"not ready after 2 s \(GET /health: HTTP 503\)"):
        srv.start().wait_ready()
    pids = wait_file(pidfile)
    assert not alive(pids["pid"]) and not alive(pids["grandchild"])


@pytest.fixture
def taken():
    """A port something else listens on for the test's length."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


# what a server prints when it lost its port: SGLang's scheduler (c10d, its own torch.distributed port; CI,
# 2026-12-05), uvicorn (vLLM, `ddtree-bench serve`), llama.cpp's llama-server
CLASHES = [
    "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. "
    "port: 25275, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use",
    "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 8000): address already in use",
    "main: couldn't bind HTTP server socket, hostname: 127.0.0.1, port: 8080",
]


@pytest.mark.parametrize("line", CLASHES, ids=["sglang-c10d", "uvicorn", "llama-server"])
def test_a_lost_port_is_told_from_other_failures_by_the_log_tail(line):
    assert port_clash(ServerError("server exited with code -9 before it was ready", f"loading\n{line}\nbye"))
    for other in ("RuntimeError: CUDA out of memory", "ValueError: unknown model type qwen3_next", ""):
        assert not port_clash(ServerError("server exited with code 1 before it was ready", other))


def test_a_start_that_lost_its_port_is_started_again_on_a_fresh_one(fake, tmp_path, taken):
    """A real clash: the first try is given a port another socket holds, so the server dies binding it (Python's
    [Errno 98]); start_ready starts it again from scratch (a new port) and returns that one, ready. Both tries share
    one log, and the ready server's log_tail holds its own start only."""
    ports = [taken, free_port()]
    made = []

    def make():
        made.append(ServerProcess([sys.executable, str(fake), "ready", str(ports[len(made)]), str(tmp_path / "p.json")],
                                  port=ports[len(made)], log_path=tmp_path / "one.log", poll_interval_s=0.1))
        return made[-1]

    with start_ready(make) as srv:   # the ready server as it is, not started a second time
        assert srv is made[1] and srv.port == ports[1] and srv.alive()
        assert made[0].returncode not in (None, 0) and not made[0].alive()
        log = srv.log_path.read_text()
        assert "Address already in use" in log and log.count("fake server ready") == 2 and log.count("$ ") == 2
        tail = srv.log_tail()
        assert "Address already in use" not in tail and f"fake server ready on {ports[1]}" in tail
    assert not srv.alive()


def test_a_server_that_lost_its_own_port_and_stays_up_is_given_up_at_once_and_started_again(fake, tmp_path):
    """SGLang's way (CI, 2026-12-07): uvicorn logs that the HTTP port is taken, the process stays up unserved and
    prints on (its warmup retries for 12 minutes). The wait ends at the clash line, not at the startup timeout; the
    error names the port and its tail holds the clash line 60 lines up; start_ready starts it again elsewhere."""
    srv, _ = _server(fake, tmp_path, "squatted", startup_timeout_s=120)
    t0 = time.monotonic()
    with pytest.raises(ServerError, match=f"port {srv.port} was taken") as e:
        srv.start().wait_ready()
    assert time.monotonic() - t0 < 30 and not srv.alive()
    assert port_clash(e.value) and f"'127.0.0.1', {srv.port}" in e.value.log_tail.splitlines()[0]
    assert "retry 59" in e.value.log_tail
    made = []

    def make():
        made.append(_server(fake, tmp_path, "squatted" if not made else "ready", startup_timeout_s=120)[0])
        return made[-1]

    with start_ready(make) as ready:
        assert ready is made[1] and ready.alive() and not made[0].alive()


def test_a_clash_line_far_above_the_end_of_the_log_still_counts(fake, tmp_path):
    """A server that lost an internal port, printed on and died: the 40-line tail alone would not show why, so the
    start would not be retried; the clash line heads the error's tail."""
    srv, _ = _server(fake, tmp_path, "clash-exit", startup_timeout_s=120)
    with pytest.raises(ServerError, match="exited with code -9") as e:
        srv.start().wait_ready()
    assert port_clash(e.value) and e.value.log_tail.splitlines()[0].startswith("ERROR:    [Errno 98]")


def test_a_lost_own_port_after_a_clash_on_another_port_still_ends_the_wait_at_once(fake, tmp_path):
    """The first clash line names another port (an internal one the server got past); the later one names its HTTP
    port. The wait ends there, and the error's tail is headed by the line that names the server's own port."""
    srv, _ = _server(fake, tmp_path, "clash-twice", startup_timeout_s=120)
    t0 = time.monotonic()
    with pytest.raises(ServerError, match=f"port {srv.port} was taken") as e:
        srv.start().wait_ready()
    assert time.monotonic() - t0 < 30 and not srv.alive()
    assert f"'127.0.0.1', {srv.port})" in e.value.log_tail.splitlines()[0]


def test_a_clash_on_another_port_does_not_end_a_start_that_goes_on_to_serve(fake, tmp_path):
    srv, _ = _server(fake, tmp_path, "clash-other", startup_timeout_s=60)
    with srv:
        assert srv.alive() and "address already in use" in srv.log_path.read_text()


def test_a_start_that_failed_otherwise_is_not_started_again(fake, tmp_path):
    made = []

    def make():
        made.append(_server(fake, tmp_path, "crash", startup_timeout_s=30)[0])
        return made[-1]

    with pytest.raises(ServerError, match="exited with code 3"):
        start_ready(make)
    assert len(made) == 1 and not made[0].alive()


def test_a_port_that_stays_taken_is_tried_a_bounded_number_of_times(fake, tmp_path, taken):
    made = []

    def make():
        made.append(ServerProcess([sys.executable, str(fake), "ready", str(taken), str(tmp_path / "p.json")],
                                  port=taken, log_path=tmp_path / f"try{len(made)}.log", poll_interval_s=0.1))
        return made[-1]

    with pytest.raises(ServerError) as e:
        start_ready(make)
    assert port_clash(e.value) and len(made) == D.SERVER_PORT_CLASH_RETRIES + 1
    assert not any(m.alive() for m in made)


def test_ports_are_drawn_below_the_ephemeral_range_where_there_is_room():
    """Where another process's bind to port 0 cannot land (a listener took an SGLang server's ephemeral port in CI,
    2026-12-07); cut to the room below the kernel's range, none where there is none."""
    lo, hi = D.SERVER_PORTS
    assert port_range((32768, 60999)) == (lo, hi) and port_range(None) == (lo, hi)
    assert port_range((lo + 10, 65535)) == (lo, lo + 9) and port_range((lo, 65535)) is None
    span = port_range(ephemeral_ports())
    ports = {free_port() for _ in range(20)}
    if span is not None:
        assert all(span[0] <= p <= span[1] for p in ports) and len(ports) > 1
    import socket

    for port in ports:   # each one free: it binds
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_full_range_falls_back_to_a_port_the_kernel_picks(monkeypatch):
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen(1)
        mine = held.getsockname()[1]
        monkeypatch.setattr(D, "SERVER_PORTS", (mine, mine))   # the whole range: one port, taken
        port = free_port()
        assert port != mine and port > 0
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_missing_executable_is_a_server_error(tmp_path):
    srv = ServerProcess(["/nonexistent/engine-serve"], port=free_port(), log_path=tmp_path / "x.log")
    with pytest.raises(ServerError, match="cannot start"):
        srv.start()


def test_sigterm_to_the_sweep_stops_its_servers(fake, tmp_path):
    """A sweep killed while its server warms up leaves no server or grandchild behind (exit 130)."""
    prof = tmp_path / "profiles"
    prof.mkdir()
    pidfile = tmp_path / "hang.pid.json"
    (prof / "standalone.yaml").write_text(
        f"name: standalone\nargv: ['{sys.executable}', '{fake}', hang, '{{port}}', '{pidfile}']\n"
        "method_args: {ar: [], dflash: [], ddtree: []}\nhealth_path: /health\n")
    out = tmp_path / "sweep"
    proc = subprocess.Popen([sys.executable, "-m", "ddtree_bench", "sweep", "--backends", "standalone", "--models", "random",
                             "--suites", "smoke", "--methods", "ar", "--limit", "1", "--profiles", str(prof),
                             "--out", str(out), "--no-report", "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        pids = wait_file(pidfile, 60)
        time.sleep(0.5)  # the sweep is now inside the warmup request, which never returns
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143 and "error: terminated (SIGTERM)" in err and f"ddtree-bench sweep --resume {out}" in err
    assert not alive(pids["pid"]) and not alive(pids["grandchild"])
    assert (out / "sweep.json").exists() and not any((out / "points").glob("*/summary.json"))
