"""What one streamed chunk costs `ddtree-bench serve` itself: server CPU microseconds a chunk.

Starts `ddtree-bench serve --null --null-chunk-tokens 1` (instant one-token chunks, no model) with this
interpreter, streams REPS requests of CHUNKS tokens each from this process (a plain `requests` reader) and
reads the server process's CPU time (user + system, /proc/<pid>/stat) around each request: CPU us a chunk is
what the event loop spends per SSE chunk (decoding the text delta, building and writing the chunk, the
metrics), the figure that competes with the engine thread for the GIL on a host-bound model. The first
request is a warm-up and left out of the median. The server runs the package this script imports (PYTHONSAFEPATH=1:
`python -m` from the repo root would otherwise put the repo's package first), named in the JSON as "package", so
`PYTHONPATH=<a copy> python benchmarks/serve_chunk_cost.py` measures that copy. Linux only (/proc).

    python benchmarks/serve_chunk_cost.py                       # 4 requests x 8,000 chunks
    python benchmarks/serve_chunk_cost.py --chunks 2000 --reps 6

Prints a line per request and, as its last line, one JSON document. Not a test: the figure depends on the
machine and on what else runs on it (alternate two codes in turn to compare them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import requests

import ddtree_bench
from ddtree_bench.backends.standalone import READY_PREFIX


def cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")   # utime + stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=8000, help="tokens (= chunks) a request")
    ap.add_argument("--reps", type=int, default=4, help="requests, the first a warm-up")
    a = ap.parse_args()
    srv = subprocess.Popen([sys.executable, "-m", "ddtree_bench", "serve", "--null", "--null-chunk-tokens", "1",
                            "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                           env={**os.environ, "PYTHONSAFEPATH": "1"})
    try:
        url = None
        for line in srv.stdout:
            if line.startswith(READY_PREFIX):
                url = line[len(READY_PREFIX):].split()[0]
                break
        if url is None:
            sys.exit(f"the null server did not start (exit {srv.wait()})")
        rows = []
        for i in range(a.reps):
            c0, t0 = cpu_s(srv.pid), time.perf_counter()
            r = requests.post(f"{url}/v1/completions", stream=True, timeout=600, json={
                "model": "null", "prompt": "x", "max_tokens": a.chunks, "stream": True, "ignore_eos": True})
            n = sum(1 for line in r.iter_lines() if line.startswith(b"data: {"))
            c1, t1 = cpu_s(srv.pid), time.perf_counter()
            rows.append({"chunks": n, "server_cpu_us_per_chunk": (c1 - c0) / n * 1e6, "wall_us_per_chunk": (t1 - t0) / n * 1e6})
            print(f"request {i}: {n} chunks, server CPU {rows[-1]['server_cpu_us_per_chunk']:.1f} us a chunk, "
                  f"wall {rows[-1]['wall_us_per_chunk']:.1f} us a chunk" + (" (warm-up)" if i == 0 else ""), flush=True)
    finally:
        srv.terminate()
        srv.wait()
    timed = rows[1:] or rows
    out = {"python": sys.version.split()[0], "package": os.path.dirname(os.path.abspath(ddtree_bench.__file__)),
           "server_pid": srv.pid, "chunks": a.chunks, "reps": a.reps, "rows": rows,
           "median_server_cpu_us_per_chunk": statistics.median(r["server_cpu_us_per_chunk"] for r in timed)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
