"""noise/gpu_clocks.py: nvidia-smi's lines parsed, shares over busy samples only, samples attributed to the spans they
fall in, and every way nvidia-smi can be missing or refuse ending in a None summary with a reason, never a raise.
The sampler runs a real process here: a stand-in nvidia-smi that checks its arguments and streams lines."""

from __future__ import annotations

import time

import pytest
from nvsmi_support import fake_nvidia_smi

from ddtree_bench.noise import gpu_clocks as gc

# lines as an H100 80GB HBM3 printed them (driver 580.159.04, 2026-12-07), in --format=csv,noheader,nounits form
IDLE = "345, 1980, 76.32, 700.00, 42, 0x0000000000000001"
FREE = "1980, 1980, 657.10, 700.00, 55, 0x0000000000000000"
CAPPED = "1530, 1980, 698.40, 700.00, 60, 0x0000000000000004"


def test_a_line_parses_to_a_sample_and_other_text_does_not():
    s = gc.parse_line(CAPPED, 1.5)
    assert (s.sm_clock_mhz, s.sm_clock_max_mhz, s.power_w, s.power_limit_w, s.temperature_c, s.reasons) == (
        1530, 1980, 698.4, 700, 60, 0x4)
    assert s.busy and not gc.parse_line(IDLE, 0).busy
    assert gc.parse_line("1530, [N/A], 698.4, 700, 60, [N/A]", 0).reasons is None
    assert gc.parse_line("Field \"clocks.max.sm\" is not a valid field to query.", 0) is None
    assert gc.parse_line("1, 2, 3", 0) is None


def test_the_summary_counts_shares_and_clocks_over_busy_samples_only():
    lines = [IDLE] * 5 + [CAPPED] * 3 + [FREE]
    s = gc.summarize([gc.parse_line(x, i) for i, x in enumerate(lines)])
    assert (s.samples, s.busy_samples) == (9, 4)
    assert s.power_capped_share == pytest.approx(0.75) and s.thermal_share == 0
    assert s.sm_clock_mhz_median == 1530 and s.sm_clock_mhz_min == 1530 and s.sm_clock_max_mhz == 1980
    assert s.power_limit_w == 700
    assert gc.summarize([]) is None


def test_the_sampler_streams_one_process_and_attributes_samples_to_their_spans(tmp_path):
    with gc.ClockSampler("GPU-abc", interval_ms=20, exe=fake_nvidia_smi(tmp_path, 20, ["-i", "GPU-abc"])) as sampler:
        time.sleep(0.15)
        with sampler.span("a"):
            time.sleep(0.3)
        time.sleep(0.15)
    assert sampler.error is None
    whole, a = sampler.summary(), sampler.summary("a")
    assert a is not None and 5 <= a.samples < whole.samples
    lo, hi = sampler.spans["a"][0]
    inside = [s for s in sampler.samples if lo <= s.t_s <= hi]
    assert a.samples == len(inside) and a.sm_clock_mhz_min == min(s.sm_clock_mhz for s in inside)
    assert 0 < a.power_capped_share < 1   # every other line capped
    assert sampler.summary("never") is None


def test_a_refused_query_or_no_nvidia_smi_gives_no_summary_and_a_reason(tmp_path, monkeypatch):
    with gc.ClockSampler(None, interval_ms=20, exe=fake_nvidia_smi(tmp_path, 20, ["-i", "GPU-abc"])) as sampler:
        time.sleep(0.2)
    assert sampler.summary() is None and sampler.error.startswith("nvidia-smi: unexpected arguments")
    monkeypatch.setattr(gc.shutil, "which", lambda name: None)
    with gc.ClockSampler() as sampler:
        with sampler.span("a"):
            pass
    assert sampler.summary("a") is None and sampler.error == "nvidia-smi not found"


def test_a_killed_benchmark_leaves_no_nvidia_smi_behind(tmp_path):
    """SIGKILL runs no __exit__: the sampler's child must still go (Linux: PR_SET_PDEATHSIG)."""
    import os
    import signal
    import subprocess
    import sys

    exe = fake_nvidia_smi(tmp_path, 20, [])
    code = ("import os, sys, time\n"
            "from ddtree_bench.noise.gpu_clocks import ClockSampler\n"
            f"s = ClockSampler(None, 20, exe={exe!r}).__enter__()\n"
            "time.sleep(0.3)\n"
            "print(s._proc.pid, len(s.samples), flush=True)\n"
            "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child_pid, samples = (int(x) for x in parent.stdout.readline().split())
    assert samples > 0   # it was streaming
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            break
        try:   # reap it if it became ours (it does not: it is re-parented), then look again
            os.waitpid(child_pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    else:
        os.kill(child_pid, signal.SIGKILL)
        raise AssertionError("the sampler's nvidia-smi outlived its killed parent")
