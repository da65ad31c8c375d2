"""`--executor ray` with an address nobody serves: exit 2 in seconds, one error line, no sweep directory.

Before this check `sweep --executor ray --ray-address 127.0.0.1:1` hung for minutes in Ray's driver
(C++ warnings every few seconds) with sweep.json and an empty summary already written; an open port
that is not a GCS made Ray end the process from C++. `sweep/ray_address.py` now asks the address
itself first. Here, against servers made in the test: a closed port, a plain HTTP server (the
dashboard mistake), a port that accepts and never answers, and a fake gRPC peer that answers the
HTTP/2 preface (passes); a real GCS is checked in tests/sweep/test_ray.py. The CLI cases need ray
installed (without it the install hint comes first, tests/sweep/test_parallel.py).
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ddtree_bench.errors import UsageError
from ddtree_bench.sweep import ray_address as RA


def closed_port() -> int:
    with socket.socket() as s:  # a port just given back: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A TCP server on loopback that answers each connection with `reply` (b"": closes it unanswered;
    None: holds it silently)."""

    def __init__(self, reply: bytes | None):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.reply, self.conns = reply, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            if self.reply is not None:
                c.recv(64)
                c.sendall(self.reply)
                if not self.reply:
                    c.close()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.fixture
def http_port():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("address, want", [
    ("10.0.0.5:6379", ("10.0.0.5", 6379)),
    ("head.cluster:6380", ("head.cluster", 6380)),
    ("ray://10.0.0.5:10002", ("10.0.0.5", 10002)),
    ("ray://10.0.0.5", ("10.0.0.5", RA.RAY_CLIENT_PORT)),
    ("[::1]:6379", ("::1", 6379)),
    ("auto", None),
    ("local", None),
])
def test_the_address_forms_ray_takes(address, want):
    assert RA.host_port(address) == want


@pytest.mark.parametrize("address, says", [
    ("http://127.0.0.1:8265", "dashboard / job-submission URL"),
    ("https://head:8265/", "dashboard / job-submission URL"),
    ("grpc://head:6379", "unknown scheme grpc://"),
    ("head", "is not HOST:PORT"),
    ("head:notaport", "is not HOST:PORT"),
    ("head:70000", "is not HOST:PORT"),
    (":6379", "is not HOST:PORT"),
])
def test_an_address_ray_would_not_take_is_a_usage_error(address, says):
    with pytest.raises(UsageError, match=says):
        RA.host_port(address)


def test_the_flag_wins_over_RAY_ADDRESS_and_neither_is_a_new_local_ray(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")
    assert RA.resolve("10.0.0.5:6379") == RA.RayAddress("10.0.0.5:6379", "--ray-address")
    assert RA.resolve(None) == RA.RayAddress("10.0.0.9:6379", "RAY_ADDRESS")
    monkeypatch.delenv("RAY_ADDRESS")
    assert RA.resolve(None) == RA.RayAddress(None, "default")
    RA.check(RA.resolve(None))  # nothing to ask: Ray starts its own


def test_a_closed_port_is_refused_by_name():
    port = closed_port()
    with pytest.raises(UsageError, match=rf"127.0.0.1:{port} \(from RAY_ADDRESS\).*[Rr]efused"):
        RA.check(RA.RayAddress(f"127.0.0.1:{port}", "RAY_ADDRESS"))


def test_an_http_server_is_named_as_one(http_port):
    with pytest.raises(UsageError, match=r"is an HTTP/1 server \(the dashboard\?\)"):
        RA.check(RA.RayAddress(f"127.0.0.1:{http_port}", "--ray-address"))


def test_a_port_that_never_answers_times_out():
    with Server(None) as srv, pytest.raises(UsageError, match="no answer within 0.5 s"):
        RA.check(RA.RayAddress(f"127.0.0.1:{srv.port}", "--ray-address"), timeout_s=0.5)


def test_a_server_closing_without_a_word_is_not_grpc():
    with Server(b"") as srv, pytest.raises(UsageError, match="is something that is not a gRPC server"):
        RA.check(RA.RayAddress(f"127.0.0.1:{srv.port}", "--ray-address"), timeout_s=2)


def test_with_ray_tls_only_the_tcp_connection_is_checked(monkeypatch, http_port):
    monkeypatch.setenv("RAY_USE_TLS", "1")   # a TLS cluster answers a plaintext preface with an alert, not SETTINGS
    RA.check(RA.RayAddress(f"127.0.0.1:{http_port}", "--ray-address"), timeout_s=2)
    port = closed_port()
    with pytest.raises(UsageError, match="[Rr]efused"):
        RA.check(RA.RayAddress(f"127.0.0.1:{port}", "--ray-address"), timeout_s=2)


def test_a_peer_answering_the_http2_preface_passes():
    settings = bytes([0, 0, 6, 4, 0, 0, 0, 0, 0]) + bytes([0, 3, 0, 0, 0, 100])  # SETTINGS, MAX_CONCURRENT_STREAMS
    with Server(settings) as srv:
        RA.check(RA.RayAddress(f"127.0.0.1:{srv.port}", "--ray-address"), timeout_s=2)


# --------------------------------------------------------------------------- the CLI


def sweep(tmp_path: Path, *args: str, env: dict | None = None, grid: bool = True) -> subprocess.CompletedProcess:
    pytest.importorskip("ray", reason='ray is not installed (pip install -e ".[ray]")')
    e = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    flags = ["--models", "random", "--suites", "smoke", "--executor", "ray"] if grid else []
    return subprocess.run([sys.executable, "-m", "ddtree_bench", "sweep", *flags, "--out", str(tmp_path / "sw"),
                           "--no-report", "-q", *args], capture_output=True, text=True, timeout=120, env={**e, **(env or {})})


def test_sweep_on_a_closed_port_is_exit_2_with_one_error_line_and_no_directory(tmp_path):
    port = closed_port()
    r = sweep(tmp_path, "--ray-address", f"127.0.0.1:{port}")
    assert r.returncode == 2, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [f"error: cannot reach the Ray cluster at 127.0.0.1:{port} (from --ray-address): Connection refused"]
    assert "Traceback" not in r.stderr and "gcs" not in r.stderr.lower()
    assert not (tmp_path / "sw").exists()


def test_sweep_on_the_dashboard_named_by_RAY_ADDRESS_is_exit_2(tmp_path, http_port):
    r = sweep(tmp_path, env={"RAY_ADDRESS": f"127.0.0.1:{http_port}"})
    assert r.returncode == 2, r.stderr
    assert f"127.0.0.1:{http_port} (from RAY_ADDRESS)" in r.stderr and "HTTP/1 server" in r.stderr
    assert not (tmp_path / "sw").exists()


def test_resume_against_a_dead_cluster_leaves_the_sweep_as_it_was(tmp_path):
    from ddtree_bench.sweep.grid import GridSpec

    sw = tmp_path / "sw"
    sw.mkdir()
    grid = GridSpec(models=["random"], suites=["smoke"], executor="ray")
    (sw / "sweep.json").write_text(json.dumps({"kind": "ddtree-bench-sweep", "version": 2, "points": [],
                                               "grid": grid.to_dict()}))
    before = {p.name: p.read_bytes() for p in sw.iterdir()}
    port = closed_port()
    r = sweep(tmp_path, "--resume", "--ray-address", f"127.0.0.1:{port}", grid=False)
    assert r.returncode == 2 and f"cannot reach the Ray cluster at 127.0.0.1:{port}" in r.stderr, r.stderr
    assert {p.name: p.read_bytes() for p in sw.iterdir()} == before


def test_dry_run_checks_the_form_and_connects_to_nothing(tmp_path):
    r = sweep(tmp_path, "--dry-run", "--ray-address", "http://127.0.0.1:8265")
    assert r.returncode == 2 and "dashboard / job-submission URL" in r.stderr, r.stderr
    r = sweep(tmp_path, "--dry-run", "--ray-address", f"127.0.0.1:{closed_port()}")
    assert r.returncode == 0 and "dry run: nothing was started or written" in r.stdout, r.stderr
