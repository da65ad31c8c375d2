"""`sweep --executor ray` on a real two-node Ray cluster on loopback (issue 21), CPU only.

The module starts a head (`--num-cpus 1`) and a second node (`--num-cpus 2`, resource `node2`), each
`ray start --block` in its own session, and stops both at the end (every process of both sessions).

* a sweep over in-process and `ddtree-bench serve` groups, one Ray task per group, gives the results
  of a local serial sweep (ids, statuses, outputs, tau, files), each point recording the Ray node it
  ran on, the server logs and paths landing in the driver's sweep directory;
* the head's GCS passes `sweep/ray_address.py`'s check (the cases that fail it: test_ray_address.py);
* the node running the tasks is killed mid-point (its raylet and workers SIGKILLed after the first
  request of a point was written): its points are failed with Ray's reason, the sweep exits 1, and
  `--resume` (on the head) completes them with whole records.

The grid, its serial sweep and the digest compared come from tests/sweep_support.py (the serial
sweep is shared with tests/sweep/test_parallel.py: run once per session).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason='ray is not installed (pip install -e ".[ray]")')

from ddtree_bench.results import read_records  # noqa: E402
from process_support import csv_rows, members, wait_for  # noqa: E402
from sweep_support import GRID, results  # noqa: E402

pytestmark = pytest.mark.slow
# RAY_AUTH_MODE: Ray 2.60 turns token authentication on for a new cluster once ~/.ray/auth_token exists (left by an
# earlier Ray run on the machine), and refuses drivers without RAY_AUTH_MODE=token; this cluster is the test's own,
# so explicitly without it
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_health_check_period_ms": "500", "RAY_health_check_timeout_ms": "500",
           "RAY_health_check_failure_threshold": "3", "RAY_health_check_initial_delay_ms": "1000",
           "RAY_AUTH_MODE": "disabled"}
CLI = [sys.executable, "-m", "ddtree_bench", "sweep"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_session(sid: int) -> None:
    for _ in range(3):
        for pid in members(session=sid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.3)


class Cluster:
    def __init__(self, root: Path):
        self.root = root
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.node2_tmp = root / "node2-tmp"
        self.node2_tmp.mkdir()
        self.env = {**os.environ, **RAY_ENV}
        self.procs: list[subprocess.Popen] = []

    def _start(self, args: list[str], log: str, env: dict) -> subprocess.Popen:
        f = open(self.root / log, "wb")
        p = subprocess.Popen(["ray", "start", *args, "--block"], stdout=f, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def start(self) -> None:
        temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # ray's unix sockets need a short path
        self.temp = temp
        self.head = self._start(["--head", "--node-ip-address", "127.0.0.1", "--port", str(self.port), "--num-cpus", "1",
                                 "--include-dashboard=false", "--object-store-memory", "80000000", "--disable-usage-stats",
                                 "--temp-dir", temp], "head.log", self.env)
        self.wait({"CPU": 1})
        self.node2 = self._start(["--address", self.address, "--node-ip-address", "127.0.0.1", "--num-cpus", "2",
                                  "--resources", json.dumps({"node2": 2}), "--object-store-memory", "80000000"],
                                 "node2.log", {**self.env, "TMPDIR": str(self.node2_tmp)})
        self.wait({"CPU": 3, "node2": 2})

    def wait(self, want: dict) -> None:
        code = (f"import ray,time,json,sys\nray.init(address={self.address!r},logging_level='ERROR')\n"
                f"end=time.time()+240\n"
                f"while time.time()<end:\n r=ray.available_resources()\n"
                f" if all(r.get(k,0)>=v-1e-9 for k,v in {want!r}.items()): sys.exit(0)\n time.sleep(0.5)\nsys.exit(1)\n")
        rc = subprocess.run([sys.executable, "-c", code], env=self.env, timeout=300, capture_output=True).returncode
        assert rc == 0, f"the Ray cluster did not come up with {want}: {(self.root / 'head.log').read_text()[-2000:]}"

    def stop(self) -> None:
        for p in self.procs:
            kill_session(p.pid)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        left = [pid for p in self.procs for pid in members(session=p.pid)]
        shutil.rmtree(getattr(self, "temp", ""), ignore_errors=True) if getattr(self, "temp", None) else None
        assert not left, f"Ray processes left behind: {left}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("ray"))
    t0 = time.monotonic()
    try:
        c.start()
        print(f"ray cluster up in {time.monotonic() - t0:.1f} s")
        yield c
    finally:
        c.stop()


def test_a_real_gcs_passes_the_address_check(cluster):
    from ddtree_bench.sweep import ray_address as RA

    RA.check(RA.RayAddress(cluster.address, "--ray-address"))  # TCP + the HTTP/2 preface answered (no UsageError)


def test_a_ray_sweep_over_two_nodes_writes_the_serial_results(cluster, serial, tmp_path):
    out = tmp_path / "sw"
    t0 = time.monotonic()
    run = subprocess.run([*CLI, *GRID, "--executor", "ray", "--ray-address", cluster.address, "--out", str(out)],
                         env=cluster.env, timeout=600, capture_output=True, text=True)
    print(f"ray sweep: {time.monotonic() - t0:.1f} s")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "(ray)" in run.stdout and "one task per server group" in run.stdout
    assert results(out) == results(serial)
    sweep = json.loads((out / "sweep.json").read_text())
    nodes = set()
    for p in sweep["points"]:
        w = json.loads((out / "points" / p["id"] / "status.json").read_text())["worker"]
        assert w["executor"] == "ray" and w["node_id"]
        nodes.add(w["node_id"])
        if p["backend"] == "standalone":
            server = json.loads((out / "points" / p["id"] / "server.json").read_text())
            assert server["log"].startswith(str(out / "servers")) and Path(server["log"]).is_file()
            assert w["server"]["pid"] == server["pid"]
    assert nodes  # (which nodes ran which task is Ray's choice)
    assert not [d for d in (out / "points").iterdir() if d.name.startswith(".")]


def test_a_node_killed_mid_point_fails_its_points_and_resume_completes_them(cluster, tmp_path):
    out = tmp_path / "sw"
    suite = tmp_path / "long.jsonl"
    suite.write_text("".join(json.dumps({"id": f"q{i}", "turns": [f"Count from {i} to {i + 30}."]}) + "\n"
                             for i in range(24)))
    grid = ["--models", "random", "--suites", str(suite), "--methods", "ddtree", "--budgets", "4", "--limit", "24",
            "--max-new-tokens", "24", "--no-report", "-q"]
    proc = subprocess.Popen([*CLI, *grid, "--executor", "ray", "--ray-address", cluster.address,
                             "--ray-resources", json.dumps({"node2": 1}), "--out", str(out)],
                            env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)

    def mid_point():  # a point's staging on node2 holds a finished request
        for f in cluster.node2_tmp.glob("ddtree-sweep-worker-*/*/points/.*partial*/records.jsonl"):
            try:
                if f.read_text().count("\n") >= 1:
                    return f
            except OSError:
                continue
        return None

    try:
        assert wait_for(mid_point, timeout_s=300), "no point started on node2"
        kill_session(cluster.node2.pid)
        text = proc.communicate(timeout=300)[0].decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, text
    rows = csv_rows(out)
    assert len(rows) == 2 and any(r["status"] == "failed" for r in rows), rows
    for r in rows:
        if r["status"] == "failed":
            assert "ray task lost" in r["error"], r
            print(f"killed node: {r['point_id']}: {r['error'][:200]}")
            assert not (out / "points" / r["point_id"] / "summary.json").exists()

    resumed = subprocess.run([*CLI, "--resume", str(out), "--executor", "ray", "--ray-address", cluster.address,
                              "--ray-resources", "{}", "-q", "--no-report"], env=cluster.env, timeout=600,
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    rows = csv_rows(out)
    assert len(rows) == 2 and all(r["status"] == "ok" for r in rows)
    for r in rows:
        recs = read_records(out / "points" / r["point_id"])
        assert sorted(x.prompt_id for x in recs) == sorted(f"q{i}" for i in range(24)) and all(x.ok for x in recs)
