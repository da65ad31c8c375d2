"""How much latency the request driver adds, and how well it keeps a Poisson schedule.

Starts `ddtree-bench serve --null` (instant tokens, no model; or uses --url) and, per concurrency C,
alternates two clients over the same requests (streaming /v1/chat/completions, same body):
  * raw    - a minimal aiohttp client: one session, C workers, time from post() to `[DONE]`;
  * driver - `driver.drive` with the HTTP backend (SSE parsing, per-chunk stamps, records; no tqdm).
Reported per client: end-to-end ms (mean, p50, p99), requests/s and the client process's CPU time
per request (the least noisy figure on a shared machine); "added" = driver - raw. Then,
open loop: for each rate R, the achieved dispatch rate ((n-1) / span of t_dispatch_ns), the rate
the seeded schedule itself implies ((n-1) / its last offset), and the client's dispatch lag behind
the schedule (t_dispatch_ns - t_send_ns) p50 / p99 / max.

    python benchmarks/driver_overhead.py                      # defaults below
    python benchmarks/driver_overhead.py --concurrency 1,16,64 --requests 400 --rates 20,100,400
    python benchmarks/driver_overhead.py --server-cpu 1 --client-cpu 0   # one core each

Prints a table and, as its last line, one JSON document. Not a test: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time

from ddtree_bench.backends.client import HTTPBackend
from ddtree_bench.driver import drive, poisson_schedule
from ddtree_bench.metrics import percentile
from ddtree_bench.records import Prompt

MESSAGES = [{"role": "user", "content": "Benchmark the driver, please."}]


def stats_ms(values_ns: list[int]) -> dict[str, float]:
    v = sorted(x / 1e6 for x in values_ns)
    return {"mean": sum(v) / len(v), "p50": percentile(v, 50), "p99": percentile(v, 99)}


async def raw_client(url: str, n: int, concurrency: int, max_tokens: int) -> tuple[list[int], float]:
    """The minimal client: e2e ns per request and requests/s."""
    import aiohttp

    body = json.dumps({"model": "null", "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0.0, "top_p": 1.0,
                       "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                       "return_token_ids": True}).encode()
    e2e: list[int] = []
    todo = list(range(n))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     headers={"Content-Type": "application/json"}) as s:
        async def one() -> None:
            t0 = time.perf_counter_ns()
            async with s.post(url + "/v1/chat/completions", data=body) as r:
                async for line in r.content:
                    if line.startswith(b"data: [DONE]"):
                        e2e.append(time.perf_counter_ns() - t0)

        async def worker() -> None:
            while todo:
                todo.pop()
                await one()

        for _ in range(concurrency):  # warm the pool, as the driver's warmup does
            await one()
        e2e.clear()
        t, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        span, cpu = time.perf_counter() - t, time.process_time() - cpu
    return e2e, n / span, cpu / n * 1e6


async def driver_client(url: str, n: int, concurrency: int, max_tokens: int, rate: float | None = None):
    b = HTTPBackend("standalone", url, model="null", timeout_s=120)
    prompts = [Prompt(f"p{i}", [MESSAGES[0]["content"]]) for i in range(n)]
    warmup = concurrency if rate is None else 4
    t, cpu = time.perf_counter(), time.process_time()
    recs = await drive(b, prompts, max_new_tokens=max_tokens, concurrency=concurrency, request_rate=rate,
                       warmup=warmup, progress=False)
    span, cpu = time.perf_counter() - t, time.process_time() - cpu
    bad = [r.error for r in recs if not r.ok]
    if bad:
        raise SystemExit(f"driver errors: {bad[:3]}")
    # req/s over the whole call (warmup included, as the raw client's timer excludes its own warmup: conservative);
    # CPU per request counts the warmup requests, which did the same work
    return recs, n / span, cpu / (n + warmup) * 1e6


def start_null_server(chunk_tokens: int, delay_ms: float, cpu: int | None) -> tuple[subprocess.Popen, str]:
    pin = (lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None
    p = subprocess.Popen([sys.executable, "-m", "ddtree_bench", "serve", "--null", "--port", "0",
                          "--null-chunk-tokens", str(chunk_tokens), "--null-delay-ms", str(delay_ms)],
                         stdout=subprocess.PIPE, text=True, preexec_fn=pin)
    m = re.search(r"ready at (http://\S+)", p.stdout.readline())
    if not m:
        p.kill()
        raise SystemExit("the null server did not start")
    return p, m.group(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="an already running null server (default: start one)")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--requests", type=int, default=400, help="requests per client per repeat")
    ap.add_argument("--repeats", type=int, default=3, help="raw/driver alternations per concurrency")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--chunk-tokens", type=int, default=4)
    ap.add_argument("--rates", default="20,100,400", help="Poisson rates (req/s) for the schedule check")
    ap.add_argument("--rate-requests", type=int, default=400)
    ap.add_argument("--delay-ms", type=float, default=0.0, help="null server: pause per chunk (0 = instant)")
    ap.add_argument("--server-cpu", type=int, help="pin the null server to this CPU")
    ap.add_argument("--client-cpu", type=int, help="pin this process (both clients) to this CPU")
    args = ap.parse_args()

    if args.client_cpu is not None:
        os.sched_setaffinity(0, {args.client_cpu})
    proc, url = (None, args.url) if args.url else start_null_server(args.chunk_tokens, args.delay_ms, args.server_cpu)
    out: dict = {"machine": {"cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]},
                 "args": vars(args), "latency": [], "poisson": []}
    try:
        print(f"null server {url}; {args.max_tokens} tokens per request in chunks of {args.chunk_tokens} "
              f"(+{args.delay_ms:g} ms each); "
              f"{args.requests} requests x {args.repeats} repeats per client")
        print(f"{'C':>4} {'client':>7} {'mean ms':>9} {'p50 ms':>9} {'p99 ms':>9} {'req/s':>8} {'cpu us/req':>10}")
        for c in [int(x) for x in args.concurrency.split(",")]:
            raw_runs, drv_runs = [], []
            for _ in range(args.repeats):
                e2e, rps, cpu_us = asyncio.run(raw_client(url, args.requests, c, args.max_tokens))
                raw_runs.append((stats_ms(e2e), rps, cpu_us))
                recs, rps, cpu_us = asyncio.run(driver_client(url, args.requests, c, args.max_tokens))
                drv_runs.append((stats_ms([r.t_done_ns - r.t_send_ns for r in recs]), rps, cpu_us))
            row = {"concurrency": c}
            for name, runs in (("raw", raw_runs), ("driver", drv_runs)):
                med = {k: sorted(r[0][k] for r in runs)[len(runs) // 2] for k in ("mean", "p50", "p99")}
                med["req_s"] = sorted(r[1] for r in runs)[len(runs) // 2]
                med["client_cpu_us_per_req"] = sorted(r[2] for r in runs)[len(runs) // 2]
                row[name] = med
                print(f"{c:>4} {name:>7} {med['mean']:9.3f} {med['p50']:9.3f} {med['p99']:9.3f} {med['req_s']:8.0f} "
                      f"{med['client_cpu_us_per_req']:10.0f}")
            row["added_ms"] = {k: row["driver"][k] - row["raw"][k] for k in ("mean", "p50", "p99")}
            row["added_client_cpu_us_per_req"] = row["driver"]["client_cpu_us_per_req"] - row["raw"]["client_cpu_us_per_req"]
            print(f"{c:>4} {'added':>7} {row['added_ms']['mean']:9.3f} {row['added_ms']['p50']:9.3f} {row['added_ms']['p99']:9.3f} "
                  f"{'':8} {row['added_client_cpu_us_per_req']:10.0f}")
            out["latency"].append(row)

        print(f"\n{'rate':>6} {'schedule':>9} {'achieved':>9} {'lag p50 ms':>11} {'lag p99 ms':>11} {'lag max ms':>11}")
        for rate in [float(x) for x in args.rates.split(",")]:
            n = args.rate_requests
            recs, _, _ = asyncio.run(driver_client(url, n, 1, args.max_tokens, rate=rate))
            sent = sorted(r.t_dispatch_ns for r in recs)
            achieved = (n - 1) / ((sent[-1] - sent[0]) / 1e9)
            scheduled = (n - 1) / poisson_schedule(n, rate, 0)[-1]
            lag = sorted(max(0, r.t_dispatch_ns - r.t_send_ns) / 1e6 for r in recs)
            row = {"rate": rate, "schedule_rate": scheduled, "achieved_rate": achieved,
                   "lag_ms": {"p50": percentile(lag, 50), "p99": percentile(lag, 99), "max": lag[-1]}}
            out["poisson"].append(row)
            print(f"{rate:6.0f} {scheduled:9.2f} {achieved:9.2f} {row['lag_ms']['p50']:11.3f} {row['lag_ms']['p99']:11.3f} "
                  f"{row['lag_ms']['max']:11.3f}")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
