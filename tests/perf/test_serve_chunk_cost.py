"""benchmarks/serve_chunk_cost.py on a CPU: a null server streams one-token chunks, the script reads the server's
CPU time around each request and reports it per chunk (warm-up left out of the median), then stops the server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_it_reports_server_cpu_per_chunk_and_leaves_no_server_behind():
    r = subprocess.run([sys.executable, "benchmarks/serve_chunk_cost.py", "--chunks", "300", "--reps", "2"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("request 0: 301 chunks") and lines[0].endswith("(warm-up)")
    out = json.loads(lines[-1])
    assert [row["chunks"] for row in out["rows"]] == [301, 301]   # 300 one-token chunks and the closing one
    assert out["median_server_cpu_us_per_chunk"] == out["rows"][1]["server_cpu_us_per_chunk"] >= 0
    assert all(row["wall_us_per_chunk"] > 0 for row in out["rows"]) and Path(out["package"]).name == "ddtree_bench"
    assert not Path(f"/proc/{out['server_pid']}").exists()   # stopped and reaped


def test_the_engine_thread_source_takes_serve_s_real_hop_and_reports_the_loop_s_share():
    r = subprocess.run([sys.executable, "benchmarks/serve_chunk_cost.py", "--source", "engine-thread", "--pause-us", "50",
                        "--chunks", "200", "--reps", "2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["source"] == "engine-thread" and out["pause_us"] == 50
    assert [row["chunks"] for row in out["rows"]] == [201, 201]
    tick_us = 1e6 / os.sysconf("SC_CLK_TCK") / 201   # /proc counts whole clock ticks: one, spread over the chunks
    for row in out["rows"]:   # the event loop is one thread of the server: its share cannot exceed the whole (read
        # inside the process's window, each reading truncated to a tick: at most one tick over, plus float rounding)
        assert 0 <= row["loop_cpu_us_per_chunk"] <= row["server_cpu_us_per_chunk"] + tick_us + 1e-6
        assert row["wall_us_per_chunk"] >= 50   # every token waited out its pause
    assert not Path(f"/proc/{out['server_pid']}").exists()
