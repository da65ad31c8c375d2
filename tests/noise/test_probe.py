"""The environment probe (noise/probe.py): what it reads, the other-processes CPU formula, the heavy-load rule."""

from __future__ import annotations

import os

import pytest

from ddtree_bench import defaults as D
from ddtree_bench.noise import probe


def snap(load1: float | None = 0.5, cores: int | None = 2, gpus=()) -> probe.EnvSnapshot:
    return probe.EnvSnapshot(0.0, cores, load1, load1, load1, 2800.0, list(gpus))


def test_a_real_snapshot_has_the_machine_fields():
    s = probe.snapshot()
    assert s.cpu_count and s.cpu_count >= 1
    assert s.load_avg_1m is not None and s.load_avg_1m >= 0  # Linux: /proc/loadavg
    d = s.to_dict()
    assert d["load_per_core"] == pytest.approx(s.load_avg_1m / s.cpu_count)
    assert probe.EnvSnapshot.from_dict(d) == s


def test_nvidia_smi_rows_parse_and_na_fields_become_none():
    text = "0, 1980, 2619, 37, 41\n1, [N/A], 2619, [N/A], 39\nnot a row\n"
    g = probe.parse_nvidia_smi(text)
    assert [(x.index, x.sm_clock_mhz, x.utilization_pct) for x in g] == [(0, 1980.0, 37.0), (1, None, None)]


def test_heavy_load_is_relative_to_the_core_count():
    share = D.HEAVY_OTHER_CORES_SHARE
    assert probe.is_heavy(snap(cores=2), other_cpu_cores=2 * share + 0.1) is True
    assert probe.is_heavy(snap(cores=16), other_cpu_cores=2 * share + 0.1) is False  # same load, more cores
    # without /proc/stat figures, the load average per core before the point decides
    assert probe.is_heavy(snap(load1=2 * D.HEAVY_LOAD_PER_CORE + 0.5, cores=2)) is True
    assert probe.is_heavy(snap(load1=0.5, cores=2)) is False
    assert probe.is_heavy(snap(load1=None, cores=None)) is None
    busy = probe.GpuState(0, 1400.0, 2600.0, 90.0, 60.0)
    assert probe.is_heavy(snap(gpus=[busy]), other_cpu_cores=0.0) is True  # someone else's kernels


def test_other_processes_cpu_is_machine_busy_time_minus_ours(monkeypatch):
    """busy jiffies 100 -> 400 and ours 10 -> 110 over 2 s at 100 Hz: others used (300 - 100) / 200 = 1 core."""
    busy = iter([100, 400])
    own = {"self": iter([10, 110]), 4242: iter([5, 5])}
    clock = iter([50.0, 52.0])
    monkeypatch.setattr(probe, "_busy_jiffies", lambda: next(busy))
    monkeypatch.setattr(probe, "_proc_jiffies", lambda pid: next(own[pid]))
    monkeypatch.setattr(probe.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(probe.os, "sysconf", lambda name: 100)
    monkeypatch.setattr(probe, "snapshot", lambda: snap(cores=2))
    rec = probe.start([4242]).finish()
    assert rec["other_cpu_cores"] == pytest.approx(1.0) and rec["other_cpu_share"] == pytest.approx(0.5)
    assert rec["heavy_load"] is (0.5 > D.HEAVY_OTHER_CORES_SHARE) and rec["wall_s"] == pytest.approx(2.0)
    assert rec["before"]["cpu_mhz_mean"] == 2800.0 and "heavy_load_rule" in rec


def test_the_real_proc_readers_return_numbers():
    assert isinstance(probe._busy_jiffies(), int)
    assert isinstance(probe._proc_jiffies("self"), int)
    assert probe._proc_jiffies(2**30) is None  # no such process


def test_a_window_samples_the_gpus_clock_all_through_the_point(tmp_path, monkeypatch):
    """Where nvidia-smi shows a GPU, the point's noise carries the clocks sampled while it ran (`gpu_during`) and
    summary.csv's two columns read them; with no nvidia-smi, none (and no process started)."""
    import time

    from nvsmi_support import fake_nvidia_smi

    from ddtree_bench.sweep.aggregate import NOISE_COLUMNS, noise_columns

    fake_nvidia_smi(tmp_path, 100, [])   # the sampler's default interval
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    w = probe.start()
    assert w.before.gpus and w.clocks is not None
    time.sleep(0.5)
    noise = w.finish()
    during = noise["gpu_during"]
    assert during["samples"] >= 2 and 0 < during["power_capped_share"] < 1 and during["sm_clock_max_mhz"] == 1980
    cols = noise_columns(noise)
    assert cols["gpu_sm_clock_mhz_during"] == during["sm_clock_mhz_median"] and cols["gpu_power_capped_share"] > 0
    assert {"gpu_sm_clock_mhz_during", "gpu_power_capped_share"} <= set(NOISE_COLUMNS)
    assert w.clocks._proc.poll() is not None   # finish() stopped it
    monkeypatch.setenv("PATH", "/nonexistent")
    w = probe.start()
    assert w.clocks is None and w.finish()["gpu_during"] is None
