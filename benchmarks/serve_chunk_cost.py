"""What one streamed chunk costs `ddtree-bench serve` itself: server CPU microseconds a chunk.

Starts a server with this interpreter, streams REPS requests of CHUNKS one-token chunks from this process (a plain
`requests` reader) and reads the server's CPU time (user + system, /proc) around each request: the whole process's,
and its event loop's (the main thread's). The first request is a warm-up and left out of the medians. Two sources:
* `--source null` (default): `ddtree-bench serve --null --null-chunk-tokens 1`, instant chunks made on the event loop
  itself: the loop's work a chunk (the text delta, the chunk's JSON, the write, the metrics);
* `--source engine-thread`: `serve_engine.EngineSource` over a paced stand-in engine on its own thread (each token
  after `--pause-us` of sleep, the GIL released as in a CUDA wait), so every chunk takes serve's real hop from the
  engine thread to the loop (on_chunk, call_soon_threadsafe, the event queue) as well; the process figure includes
  the stand-in's own sleeping and handing over.
On a host-bound model (the toy pair on a GPU, AR: rounds of ~0.12 ms) this work shares the GIL with the engine thread,
so it is a share of every round. The server runs the package this script imports (PYTHONSAFEPATH=1: `python -m`
from the repo root would otherwise put the repo's package first), named in the JSON as "package", so
`PYTHONPATH=<a copy> python benchmarks/serve_chunk_cost.py` measures that copy. Linux only (/proc).

    python benchmarks/serve_chunk_cost.py                       # null source, 4 requests x 8,000 chunks
    python benchmarks/serve_chunk_cost.py --source engine-thread --pause-us 100 --chunks 4000

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


def cpu_s(pid: int, tid: int | None = None) -> float:
    """The process's CPU seconds (user + system), or one of its threads' (`tid`)."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve_engine_thread(pause_us: float) -> None:
    """The child of `--source engine-thread`: serve over EngineSource with a paced stand-in engine (no model)."""
    import asyncio
    import tempfile
    from pathlib import Path
    from types import SimpleNamespace

    from ddtree_bench.backends.serve_engine import EngineSource
    from ddtree_bench.backends.standalone import serve
    from ddtree_bench.tokenizer import ChatTokenizer
    from ddtree_bench.toy.tokenizer import IM_END, write_tokenizer

    class PacedEngine:
        block_size = 1
        target = SimpleNamespace(cfg=SimpleNamespace(vocab_size=272, max_position_embeddings=1 << 24))

        def generate(self, prompt_ids, method, budget, max_new_tokens, on_chunk=None, **_):
            for i in range(max_new_tokens):
                time.sleep(pause_us / 1e6)
                on_chunk([ord("a") + i % 26])
            return SimpleNamespace(accept_lengths=[1] * max_new_tokens, finish_reason="length", stage_ns={})

    tmp = tempfile.mkdtemp(prefix="ddtree-bench-tok-")
    write_tokenizer(Path(tmp))
    pair = SimpleNamespace(engine=PacedEngine(), tokenizer=ChatTokenizer(tmp), stop_ids=[IM_END], info={})
    asyncio.run(serve(EngineSource(pair, "ar", 0, "null"), port=0,
                      on_ready=lambda url: print(f"{READY_PREFIX}{url}", flush=True)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunks", type=int, default=8000, help="tokens (= chunks) a request")
    ap.add_argument("--reps", type=int, default=4, help="requests, the first a warm-up")
    ap.add_argument("--source", choices=("null", "engine-thread"), default="null")
    ap.add_argument("--pause-us", type=float, default=100.0, help="engine-thread: sleep before each token")
    ap.add_argument("--serve-engine-thread", action="store_true", help=argparse.SUPPRESS)   # the child's role
    a = ap.parse_args()
    if a.serve_engine_thread:
        serve_engine_thread(a.pause_us)
        return
    cmd = ([sys.executable, "-m", "ddtree_bench", "serve", "--null", "--null-chunk-tokens", "1", "--port", "0"]
           if a.source == "null" else
           [sys.executable, os.path.abspath(__file__), "--serve-engine-thread", "--pause-us", str(a.pause_us)])
    srv = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                           env={**os.environ, "PYTHONSAFEPATH": "1"})
    try:
        url = None
        for line in srv.stdout:
            if line.startswith(READY_PREFIX):
                url = line[len(READY_PREFIX):].split()[0]
                break
        if url is None:
            sys.exit(f"the {a.source} server did not start (exit {srv.wait()})")
        rows = []
        for i in range(a.reps):
            c0, l0, t0 = cpu_s(srv.pid), cpu_s(srv.pid, srv.pid), time.perf_counter()
            r = requests.post(f"{url}/v1/completions", stream=True, timeout=600, json={
                "model": "null", "prompt": "x", "max_tokens": a.chunks, "stream": True, "ignore_eos": True})
            n = sum(1 for line in r.iter_lines() if line.startswith(b"data: {"))
            l1, c1, t1 = cpu_s(srv.pid, srv.pid), cpu_s(srv.pid), time.perf_counter()   # the loop window inside the process one
            rows.append({"chunks": n, "server_cpu_us_per_chunk": (c1 - c0) / n * 1e6,
                         "loop_cpu_us_per_chunk": (l1 - l0) / n * 1e6, "wall_us_per_chunk": (t1 - t0) / n * 1e6})
            print(f"request {i}: {n} chunks, server CPU {rows[-1]['server_cpu_us_per_chunk']:.1f} us a chunk (event "
                  f"loop {rows[-1]['loop_cpu_us_per_chunk']:.1f}), wall {rows[-1]['wall_us_per_chunk']:.1f} us a chunk"
                  + (" (warm-up)" if i == 0 else ""), flush=True)
    finally:
        srv.terminate()
        srv.wait()
    timed = rows[1:] or rows
    out = {"python": sys.version.split()[0], "package": os.path.dirname(os.path.abspath(ddtree_bench.__file__)),
           "source": a.source, "pause_us": a.pause_us if a.source == "engine-thread" else None,
           "server_pid": srv.pid, "chunks": a.chunks, "reps": a.reps, "rows": rows,
           "median_server_cpu_us_per_chunk": statistics.median(r["server_cpu_us_per_chunk"] for r in timed),
           "median_loop_cpu_us_per_chunk": statistics.median(r["loop_cpu_us_per_chunk"] for r in timed)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
