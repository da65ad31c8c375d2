"""Where a host-bound round's time goes: one request at a time through the single loop, the batched loop without
the scheduler, and the batched loop behind the scheduler thread (what `serve --max-batch N` runs), in one process.

On a small model a round's GPU work (~0.1 ms for the tiny random pair's AR round) is shorter than the host's work
to queue and read it, so every microsecond of Python per round shows in the time per token. For one method point
(--method, --budget) this runs --requests prompts of --prefix-len random tokens, --new tokens each, after one warmup
request, through:

* single  - `Engine(cuda_graphs=True).generate` (what `serve --max-batch 1` runs);
* loop    - `BatchFastLoop(max_batch=--slots).run([request])`, one request per call, on this thread;
* sched   - a `BatchScheduler` over such a loop with its lone path off (`lone=False`: every round a batched
            step): submit, wait for the result (the engine thread's hand-off);
* lone    - the `BatchScheduler` as `serve --max-batch N` makes it: a request alone runs through the single loop
            (`BatchFastLoop.run_alone`), on the engine thread.

With --with-short N every request but single's is sent together with a short one of N new tokens: after the short
one ends, the measured request goes on alone in the batch - in batched steps of one (loop, sched) or back in the
single loop (lone: `BatchFastLoop.resume_alone`); its decode time is then mostly that tail.

Prints, per path, the median decode ms per token ((t_done - t_first) / (tokens - 1): rounds, not prefill), the
paths interleaved request by request so that a drifting clock hits all three alike, and for loop and sched the
median host time inside one `step` and between steps. With --consumer-us Y every chunk goes to an asyncio thread
that spends Y us of Python on it (serve's shape; single then runs on a worker thread, loop is left out), to see
how a server's GIL traffic lengthens each path's rounds. With --cprofile, a second pass of each path runs under
cProfile (single: the whole generate; loop and sched: inside their steps, on the engine thread for sched) and
prints its top --top functions by own time. With --micro, the host cost (us a call) of the operations a round's
bookkeeping makes: CUDA events, stream lookups, inference_mode, a Condition hand-off.

    python benchmarks/gpu_host_profile.py --method ar --micro --cprofile
    python benchmarks/gpu_host_profile.py --method dflash --requests 4 --new 128
    python benchmarks/gpu_host_profile.py --method ar --consumer-us 100
    python benchmarks/gpu_host_profile.py --method ar --consumer-us 100 --trace   # where a token's us go
    python benchmarks/gpu_host_profile.py --device cpu --requests 2 --new 8   # a CPU smoke run (no events)
    python benchmarks/gpu_host_profile.py --method ar --with-short 4   # the tail after a batch-mate ended
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import statistics
import sys
import threading
import time

import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--method", default="ar", choices=["ar", "dflash", "ddtree"])
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--prefix-len", type=int, default=256)
    ap.add_argument("--cprofile", action="store_true", help="a second pass of each path under cProfile")
    ap.add_argument("--top", type=int, default=22)
    ap.add_argument("--micro", action="store_true", help="host cost of single operations (CUDA only)")
    ap.add_argument("--consumer-us", type=float, default=0.0,
                    help="stream every chunk to an asyncio thread that spends this many us of Python on it, as "
                         "serve's handler does (single then runs on a worker thread, as serve runs it)")
    ap.add_argument("--trace", action="store_true",
                    help="with --consumer-us: a timeline per path (where a token's microseconds go between the "
                         "engine thread and the consumer)")
    ap.add_argument("--with-short", type=int, default=0, metavar="N",
                    help="send each request (but single's) with a short one of N new tokens: the tail alone in a batch")
    a = ap.parse_args(argv)
    if a.trace and a.consumer_us <= 0:
        ap.error("--trace needs --consumer-us")

    from ddtree_bench.engine.batch import BatchRequest
    from ddtree_bench.engine.batch_scheduler import BatchScheduler
    from ddtree_bench.engine.generate import Engine
    from ddtree_bench.engine.gpu.batch_loop import BatchFastLoop
    from ddtree_bench.engine.loading import random_pair

    dev = torch.device(a.device)
    target, drafter = random_pair(seed=0, vocab_size=272, dtype=a.dtype, device=a.device)
    eng = Engine(target, drafter, cuda_graphs=True)
    V = target.cfg.vocab_size
    prompts = [[random.Random(i).randrange(V) for _ in range(a.prefix_len)] for i in range(a.requests + 1)]
    proposer = eng.proposer if a.method != "ar" else None
    loop = BatchFastLoop(eng.target, proposer, a.method, a.budget, a.slots)
    sched = BatchScheduler(BatchFastLoop(eng.target, proposer, a.method, a.budget, a.slots), lone=False)
    lone = BatchScheduler(BatchFastLoop(eng.target, proposer, a.method, a.budget, a.slots))
    clocks = {"loop": StepClock(loop), "sched": StepClock(sched.loop),
              "lone": StepClock(lone.loop, "step" if a.with_short else "run_alone")}
    if a.consumer_us > 0:   # serve's shape: engine on a worker thread, every chunk handed to an asyncio thread
        from concurrent.futures import ThreadPoolExecutor

        consumer, worker = Consumer(a.consumer_us), ThreadPoolExecutor(1)
        req = lambda p: BatchRequest(p, a.new, on_chunk=consumer.on_chunk)  # noqa: E731
        paths = {
            "single": lambda p: worker.submit(eng.generate, p, a.method, a.budget, a.new,
                                              on_chunk=consumer.on_chunk).result(timeout=600),
            "sched": lambda p: with_short(sched, p),
            "lone": lambda p: with_short(lone, p),
        }
    else:
        req = lambda p: BatchRequest(p, a.new)  # noqa: E731
        paths = {
            "single": lambda p: eng.generate(p, a.method, a.budget, a.new),
            "loop": lambda p: loop.run([req(p)] + short(p))[0],
            "sched": lambda p: with_short(sched, p),
            "lone": lambda p: with_short(lone, p),
        }

    def short(p) -> list:
        return [BatchRequest(p[::-1], a.with_short)] if a.with_short else []

    def with_short(s, p):
        fut, others = s.submit(req(p)), [s.submit(r) for r in short(p)]
        for f in others:
            f.result(timeout=600)
        return fut.result(timeout=600)

    def decode_ms(g) -> float:
        return (g.t_done_ns - g.t_first_token_ns) / 1e6 / max(1, len(g.output_ids) - 1)

    times: dict[str, list[float]] = {k: [] for k in paths}
    timeline = Timeline(consumer) if a.trace else None
    try:
        for i, p in enumerate(prompts):
            for name, run in paths.items():
                if timeline is not None:   # chunks of an earlier run (the warm-up's too) handled first, not traced
                    consumer.drain()
                    timeline.start()
                g = run(p)
                if i:   # prompt 0 warms up (compiles, captures)
                    times[name].append(decode_ms(g))
                    if timeline is not None:
                        consumer.drain()
                        timeline.keep(name)
        base = statistics.median(times["single"])
        for name, v in times.items():
            m = statistics.median(v)
            clock = f"; {clocks[name].summary()}" if name in clocks else ""
            print(f"{a.method:7s} {name:6s} decode ms/token {m:.4f} = {m / base:.3f}x single  "
                  f"(runs {' '.join(f'{x:.4f}' for x in v)}){clock}", flush=True)
        if timeline is not None:
            for name in paths:
                print(f"trace   {name:6s} {timeline.summary(name)}", flush=True)
        if a.cprofile:
            for name, run in paths.items():
                print(f"\n## cProfile, {name} ({len(prompts) - 1} requests; own time, top {a.top})")
                prof = cProfile.Profile()
                if name in clocks:   # inside the steps, on the thread that runs them
                    clocks[name].prof = prof
                else:
                    prof.enable()
                for p in prompts[1:]:
                    run(p)
                if name in clocks:
                    clocks[name].prof = None
                else:
                    prof.disable()
                buf = io.StringIO()
                pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(a.top)
                print("\n".join(line for line in buf.getvalue().splitlines() if line.strip()), flush=True)
    finally:
        sched.close()
        lone.close()
    handled = f" ({consumer.drain()} handled)" if a.consumer_us > 0 else ""
    if a.micro and dev.type == "cuda":
        micro()
    print(f"# random pair {a.dtype} on {torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}, "
          f"{a.method}{f' B={a.budget}' if a.method == 'ddtree' else ''}, {a.requests} requests of {a.new} tokens "
          f"after {a.prefix_len}, one at a time{f' (each with a short one of {a.with_short})' if a.with_short else ''}, "
          f"{a.slots} slots"
          f"{f', chunks to a {a.consumer_us:g} us consumer thread{handled}' if a.consumer_us > 0 else ''}; medians",
          file=sys.stderr)
    return 0


class Consumer:
    """An asyncio loop on its own thread, as `serve` runs one: each chunk comes over with call_soon_threadsafe
    and costs `us` microseconds of Python there, holding the GIL (serve's handler detokenises, formats and
    writes each chunk), then a write to a pipe (a syscall: where a socket write would let the GIL go)."""

    def __init__(self, us: float):
        import asyncio
        import os

        self.ns = int(us * 1e3)
        self.handled = 0
        self.timeline: Timeline | None = None
        self.loop = asyncio.new_event_loop()
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        threading.Thread(target=self.loop.run_forever, daemon=True, name="consumer").start()

    def on_chunk(self, tokens) -> None:
        if self.timeline is not None:
            self.timeline.emits.append(time.perf_counter_ns())
        self.loop.call_soon_threadsafe(self._handle, list(tokens))

    def drain(self) -> int:
        """Wait for every chunk handed over so far (callbacks run in order); returns how many were handled."""
        import asyncio

        async def nothing():
            return None
        asyncio.run_coroutine_threadsafe(nothing(), self.loop).result(timeout=60)
        return self.handled

    def _handle(self, tokens) -> None:
        import os

        t0 = time.perf_counter_ns()
        end, x = t0 + self.ns, 0
        while time.perf_counter_ns() < end:
            x += len(tokens)
        self.handled += 1
        os.write(self.w, b"x")
        try:
            os.read(self.r, 4096)
        except BlockingIOError:
            pass
        if self.timeline is not None:
            self.timeline.spans.append((t0, time.perf_counter_ns()))


class Timeline:
    """With a consumer thread: per request, when the engine thread waited for each round's result (Ticket.take, entered
    and returned), when each chunk was handed over (on_chunk) and when the consumer began and ended it. Per path it
    reports medians over rounds, in us: `engine` - from one result's return to the next wait (the engine thread's own
    work a round, the GIL held but for its CUDA calls); `wait` - inside take (the GPU's round, or the GIL held by the
    consumer when the round is done); `wake` - from a chunk's hand-over to the consumer starting on it; `handle` - the
    consumer's work; `regain` - from the consumer's end to the engine's return from take, in rounds where the
    consumer ended inside that wait (the engine waiting for the GIL, then for the OS to run it); and `late` - the
    share of rounds whose wait the consumer's work ended in."""

    def __init__(self, consumer: "Consumer"):
        from ddtree_bench.engine.gpu.loop import Ticket

        self.takes: list[tuple[int, int]] = []
        self.emits: list[int] = []
        self.spans: list[tuple[int, int]] = []
        self.kept: dict[str, list[tuple]] = {}
        take = Ticket.take

        def timed_take(ticket):
            t0 = time.perf_counter_ns()
            try:
                return take(ticket)
            finally:
                self.takes.append((t0, time.perf_counter_ns()))

        Ticket.take = timed_take
        consumer.timeline = self

    def start(self) -> None:
        self.takes, self.emits, self.spans = [], [], []

    def keep(self, name: str) -> None:
        self.kept.setdefault(name, []).append((list(self.takes), list(self.emits), list(self.spans)))

    def summary(self, name: str) -> str:
        engine, wait, wake, handle, regain, late, rounds = [], [], [], [], [], 0, 0
        for takes, emits, spans in self.kept.get(name, []):
            wait += [(b - a) / 1e3 for a, b in takes]
            engine += [(c - b) / 1e3 for (_, b), (c, _) in zip(takes, takes[1:])]
            wake += [(s - e) / 1e3 for e, (s, _) in zip(emits, spans)]
            handle += [(b - a) / 1e3 for a, b in spans]
            ends = sorted(b for _, b in spans)
            for a, b in takes:
                rounds += 1
                inside = [e for e in ends if a <= e <= b]
                if inside:
                    late += 1
                    regain.append((b - inside[-1]) / 1e3)
        med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
        return (f"us a round: engine {med(engine):.1f}, wait {med(wait):.1f}, wake {med(wake):.1f}, handle "
                f"{med(handle):.1f}, regain {med(regain):.1f}; late {late}/{rounds} rounds")


class StepClock:
    """Wraps a batched loop's `step` - or, with method="run_alone", its lone path: one call a request - (on whatever
    thread runs it): each call's enter and exit times, and, while `prof` is set, a cProfile enabled around each call
    (cProfile sees only the thread that enables it)."""

    def __init__(self, loop, method: str = "step"):
        self.method, self.step, self.spans, self.prof = method, getattr(loop, method), [], None
        setattr(loop, method, self)

    def __call__(self, *args, **kw):
        t0 = time.perf_counter_ns()
        if self.prof is not None:
            self.prof.enable()
        try:
            return self.step(*args, **kw)
        finally:
            if self.prof is not None:
                self.prof.disable()
            self.spans.append((t0, time.perf_counter_ns()))

    def summary(self) -> str:
        """Median us inside a step and between one step's end and the next one's start (within a request)."""
        if self.method != "step":
            return f"{len(self.spans)} calls of {self.method}, no step"
        inside = [(b - a) / 1e3 for a, b in self.spans]
        gaps = [(c - b) / 1e3 for (_, b), (c, _) in zip(self.spans, self.spans[1:]) if c - b < 5e6]
        return (f"step {statistics.median(inside):.1f} us inside, {statistics.median(gaps) if gaps else 0:.1f} us "
                f"between steps ({len(inside)} steps)")


def micro(n: int = 20000) -> None:
    """Host microseconds a call, on the current CUDA stream, of what a round's bookkeeping does."""
    s = torch.cuda.current_stream()
    evs = [torch.cuda.Event(enable_timing=True) for _ in range(8)]
    for e in evs:
        e.record(s)
    torch.cuda.synchronize()
    cv = threading.Condition()

    def timed(what: str, f) -> None:
        for _ in range(200):
            f()
        t0 = time.perf_counter_ns()
        for _ in range(n):
            f()
        print(f"micro {what:44s} {(time.perf_counter_ns() - t0) / n / 1e3:7.2f} us", flush=True)

    timed("torch.cuda.Event(enable_timing=True)", lambda: torch.cuda.Event(enable_timing=True))
    timed("Event() + record() (new event)", lambda: torch.cuda.Event(enable_timing=True).record())
    timed("event.record() (current stream looked up)", lambda: evs[0].record())
    timed("event.record(stream)", lambda: evs[0].record(s))
    timed("torch.cuda.current_stream()", torch.cuda.current_stream)
    torch.cuda.synchronize()
    timed("done_event.synchronize()", evs[1].synchronize)
    timed("a.elapsed_time(b)", lambda: evs[1].elapsed_time(evs[2]))

    def im():
        with torch.inference_mode():
            pass
    timed("with torch.inference_mode()", im)

    def lock():
        with cv:
            pass
    timed("with threading.Condition()", lock)
    pinned = torch.zeros(8, dtype=torch.long, pin_memory=True)
    timed("pinned[:8].tolist()", lambda: pinned[:8].tolist())


if __name__ == "__main__":
    sys.exit(main())
