"""benchmarks/gpu_host_profile.py end to end on a CPU (eager rounds, perf_counter marks): one line per path with its
decode ms a token against the single loop, the batched paths' step clock (the scheduler's lone path makes no step:
its requests run through the single loop), cProfile tables read inside the engine thread, and the consumer-thread
form (serve's shape) that leaves the calling-thread path out; with a short batch-mate, the lone path's steps are only
the rounds shared with it (the rest back in the single loop)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_host_profile.py"
ARGS = [sys.executable, str(SCRIPT), "--device", "cpu", "--requests", "2", "--new", "6", "--prefix-len", "12"]


def _paths(out: str) -> dict[str, str]:
    return {m.group(1): m.group(0) for m in re.finditer(r"^ar\s+(\w+)\s+decode ms/token .*$", out, re.M)}


def test_four_paths_each_timed_against_the_single_loop_with_profiles():
    # --top 1000: every function profiled is listed, so the check below does not hang on own-time ranks, which move
    # with the load (a run with rotate_half above target_forward in the lone path's top 5 failed in CI, b1d7803)
    r = subprocess.run(ARGS + ["--cprofile", "--top", "1000"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    paths = _paths(r.stdout)
    assert list(paths) == ["single", "loop", "sched", "lone"]
    assert "= 1.000x single" in paths["single"]
    for name in ("loop", "sched"):   # the step clock: its steps counted (5 new tokens: 5 rounds a request, 2 requests)
        m = re.search(r"step [\d.]+ us inside, [\d.]+ us between steps \((\d+) steps\)", paths[name])
        assert m and int(m.group(1)) >= 10, paths[name]
    assert "3 calls of run_alone, no step" in paths["lone"]   # every request (1 warms up) ran alone, no batched step
    tables = re.findall(r"## cProfile, (\w+) .*\n\s+(\d+) function calls", r.stdout)
    assert [t[0] for t in tables] == ["single", "loop", "sched", "lone"] and all(int(t[1]) > 100 for t in tables)
    for name in ("sched", "lone"):   # the engine thread's work was seen
        assert "target_forward" in r.stdout.split(f"## cProfile, {name}")[1].split("## cProfile")[0], name


def test_a_consumer_thread_takes_every_chunk_and_the_calling_thread_path_is_left_out():
    r = subprocess.run(ARGS + ["--consumer-us", "50"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert list(_paths(r.stdout)) == ["single", "sched", "lone"]
    # 3 requests a path (1 warms up), each its first token and 5 AR rounds' tokens: 6 chunks, all handled there
    assert "chunks to a 50 us consumer thread (54 handled)" in r.stderr, r.stderr


def test_the_trace_splits_each_path_s_rounds_between_engine_and_consumer():
    r = subprocess.run(ARGS + ["--consumer-us", "50", "--trace"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    traces = dict(re.findall(r"^trace\s+(\w+)\s+(.*)$", r.stdout, re.M))
    assert list(traces) == ["single", "sched", "lone"], r.stdout
    for line in traces.values():   # 2 timed requests x 5 rounds each; the consumer's work at least its 50 us
        m = re.fullmatch(r"us a round: engine ([\d.]+), wait ([\d.]+), wake ([\d.]+), handle ([\d.]+), "
                         r"regain (\S+); late (\d+)/(\d+) rounds", line)
        assert m, r.stdout
        assert float(m.group(4)) >= 50 and int(m.group(7)) == 10 and int(m.group(6)) <= 10, r.stdout
    bad = subprocess.run(ARGS + ["--trace"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--trace needs --consumer-us" in bad.stderr


def test_with_a_short_batch_mate_the_lone_path_finishes_in_the_single_loop():
    """--with-short: each request shares its first round with a short one; afterwards sched and loop step it alone in
    the batch, while the lone path hands it back to the single loop (resume_alone): few steps there, all in sched."""
    r = subprocess.run(ARGS[:-4] + ["--new", "12", "--prefix-len", "12", "--with-short", "2"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    paths = _paths(r.stdout)
    assert list(paths) == ["single", "loop", "sched", "lone"] and "each with a short one of 2" in r.stderr
    steps = {name: int(re.search(r"\((\d+) steps\)", paths[name]).group(1)) for name in ("loop", "sched", "lone")}
    assert steps["sched"] >= 30 and steps["lone"] <= steps["sched"] / 3, steps   # 3 requests x 11 rounds
