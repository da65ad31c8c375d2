"""The machine's state around a measurement: load average, CPU frequency, GPU clocks and utilisation.

`snapshot()` reads /proc/loadavg (`os.getloadavg`), the mean `cpu MHz` of /proc/cpuinfo (else
/sys/.../cpufreq/scaling_cur_freq), and, when `nvidia-smi` is on PATH, per GPU the SM and memory
clocks (MHz), utilisation (%) and temperature (C) — each field None where the machine does not
say. It never raises: a probe must not fail a benchmark.

A `Window` (`start(pids)` ... `.finish()`) takes a snapshot before and after a point, samples the GPUs' SM
clock and power cap all through it where nvidia-smi exists (noise/gpu_clocks.py, every GPU's samples together:
`gpu_during`, the median busy SM clock and the share of busy samples at the power cap), and, from
/proc/stat and /proc/<pid>/stat, the CPU time other processes used meanwhile:
other_cpu_cores = (busy jiffies of the machine - jiffies of this process, its reaped children and
`pids` (a server)) / (wall seconds x CLK_TCK), with busy = user + nice + system + irq + softirq +
steal (steal: time the hypervisor gave to other guests). A server's own worker processes are
not in `pids`, so they count as "others" (an over-estimate for multi-process servers).

Heavy load (`is_heavy`), relative to the core count: other processes kept more than
`defaults.HEAVY_OTHER_CORES_SHARE` (0.5) of the cores busy while the point ran; where /proc/stat
is unreadable, the 1-minute load average per core before the point exceeded
`defaults.HEAVY_LOAD_PER_CORE` (1.0); or a GPU was more than 5 % busy before the point started
(someone else's kernels). The load average alone cannot be the rule inside a sweep: it decays
over a minute, so it still carries the previous point's own threads.

Knows /proc, /sys and nvidia-smi; nothing of sweeps or results.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ddtree_bench import defaults as D
from ddtree_bench.noise.gpu_clocks import ClockSampler, cell_number, summary_dict

GPU_BUSY_PCT = 5.0
_NVSMI_FIELDS = ("index", "clocks.sm", "clocks.mem", "utilization.gpu", "temperature.gpu")


@dataclass
class GpuState:
    index: int
    sm_clock_mhz: float | None
    mem_clock_mhz: float | None
    utilization_pct: float | None
    temperature_c: float | None


@dataclass
class EnvSnapshot:
    unix_time_s: float
    cpu_count: int | None
    load_avg_1m: float | None
    load_avg_5m: float | None
    load_avg_15m: float | None
    cpu_mhz_mean: float | None
    gpus: list[GpuState] = field(default_factory=list)

    @property
    def load_per_core(self) -> float | None:
        if self.load_avg_1m is None or not self.cpu_count:
            return None
        return self.load_avg_1m / self.cpu_count

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["load_per_core"] = self.load_per_core
        return d

    @classmethod
    def from_dict(cls, d: Any) -> "EnvSnapshot | None":
        if not isinstance(d, dict):
            return None
        gpus = [GpuState(**{k: g.get(k) for k in GpuState.__dataclass_fields__}) for g in d.get("gpus") or [] if isinstance(g, dict)]
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__ if k != "gpus"}, gpus=gpus)


def cpu_mhz() -> float | None:
    """Mean current CPU frequency over cores, MHz."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            vals = [cell_number(line.split(":", 1)[1]) for line in f if line.lower().startswith("cpu mhz")]
        vals = [v for v in vals if v]
        if vals:
            return sum(vals) / len(vals)
    except OSError:
        pass
    vals = []
    for path in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq"):
        try:
            with open(path, encoding="utf-8") as f:
                v = cell_number(f.read())
            if v:
                vals.append(v / 1000.0)  # kHz -> MHz
        except OSError:
            continue
    return sum(vals) / len(vals) if vals else None


def parse_nvidia_smi(text: str) -> list[GpuState]:
    """Rows of `nvidia-smi --query-gpu=index,clocks.sm,clocks.mem,utilization.gpu,temperature.gpu
    --format=csv,noheader,nounits` -> GpuState ('[N/A]' fields become None)."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(_NVSMI_FIELDS) or cell_number(cells[0]) is None:
            continue
        sm, mem, util, temp = (cell_number(c) for c in cells[1:5])
        out.append(GpuState(int(float(cells[0])), sm_clock_mhz=sm, mem_clock_mhz=mem, utilization_pct=util, temperature_c=temp))
    return out


def gpu_states(timeout_s: float = D.ENV_PROBE_TIMEOUT_S) -> list[GpuState]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        res = subprocess.run([exe, f"--query-gpu={','.join(_NVSMI_FIELDS)}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_nvidia_smi(res.stdout) if res.returncode == 0 else []


def snapshot() -> EnvSnapshot:
    try:
        l1, l5, l15 = os.getloadavg()
    except OSError:
        l1 = l5 = l15 = None
    return EnvSnapshot(time.time(), os.cpu_count(), l1, l5, l15, cpu_mhz(), gpu_states())


def is_heavy(before: EnvSnapshot | None, other_cpu_cores: float | None = None,
             share: float = D.HEAVY_OTHER_CORES_SHARE, per_core: float = D.HEAVY_LOAD_PER_CORE) -> bool | None:
    """The heavy-load rule of the module docstring; None when nothing says how loaded the machine was."""
    busy_gpu = before is not None and any((g.utilization_pct or 0.0) > GPU_BUSY_PCT for g in before.gpus)
    cores = before.cpu_count if before is not None else None
    if other_cpu_cores is not None and cores:
        return busy_gpu or other_cpu_cores / cores > share
    lpc = before.load_per_core if before is not None else None
    if lpc is None:
        return True if busy_gpu else None
    return busy_gpu or lpc > per_core


HEAVY_RULE = (f"other processes used > {D.HEAVY_OTHER_CORES_SHARE:g} of the CPU cores while the point ran "
              f"(else: 1-min load average / cores > {D.HEAVY_LOAD_PER_CORE:g} before it), or a GPU was > "
              f"{GPU_BUSY_PCT:g}% busy before it")


def _busy_jiffies() -> int | None:
    """Busy jiffies of the whole machine (the /proc/stat `cpu` line, see the module docstring)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            cells = f.readline().split()
        if cells[0] != "cpu":
            return None
        v = [int(x) for x in cells[1:9]]
        return v[0] + v[1] + v[2] + v[5] + v[6] + v[7]  # user nice system, irq softirq steal (not idle, iowait)
    except (OSError, ValueError, IndexError):
        return None


def _proc_jiffies(pid: int | str) -> int | None:
    """utime + stime + cutime + cstime of a process (fields 14-17 of /proc/<pid>/stat)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return sum(int(x) for x in rest[11:15])
    except (OSError, ValueError, IndexError):
        return None


class Window:
    """Before/after snapshots of one measurement and the CPU other processes took meanwhile."""

    def __init__(self, pids: list[int] | None = None):
        self.pids = ["self", *(pids or [])]
        self.before = snapshot()
        self.clocks = ClockSampler().__enter__() if self.before.gpus else None   # stopped by finish()
        self.t0 = time.monotonic()
        self.busy0 = _busy_jiffies()
        self.own0 = {p: _proc_jiffies(p) for p in self.pids}

    def add_pid(self, pid: int | None) -> None:
        if pid is not None and pid not in self.pids:
            self.pids.append(pid)
            self.own0[pid] = _proc_jiffies(pid)

    def finish(self) -> dict[str, Any]:
        busy1 = _busy_jiffies()
        wall_s = time.monotonic() - self.t0
        own = 0
        for p in self.pids:
            a, b = self.own0.get(p), _proc_jiffies(p)
            if a is not None and b is not None:
                own += b - a
        other = None
        if self.busy0 is not None and busy1 is not None and wall_s > 0:
            other = max(0.0, (busy1 - self.busy0 - own) / (wall_s * os.sysconf("SC_CLK_TCK")))
        if self.clocks is not None:
            self.clocks.__exit__(None, None, None)
        return describe(self.before, snapshot(), other, wall_s, summary_dict(self.clocks))


def start(pids: list[int] | None = None) -> Window:
    return Window(pids)


def describe(before: EnvSnapshot | None, after: EnvSnapshot | None, other_cpu_cores: float | None = None,
             wall_s: float | None = None, gpu_during: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a point records (status.json `noise`): both snapshots, the GPUs' clocks during it (a
    noise.gpu_clocks.ClockSummary as a dict, or None), the others' CPU and the heavy flag."""
    cores = (before or after).cpu_count if (before or after) else None
    return {"before": before.to_dict() if before else None, "after": after.to_dict() if after else None,
            "gpu_during": gpu_during, "wall_s": wall_s, "other_cpu_cores": other_cpu_cores,
            "other_cpu_share": (other_cpu_cores / cores) if other_cpu_cores is not None and cores else None,
            "heavy_load": is_heavy(before, other_cpu_cores), "heavy_load_rule": HEAVY_RULE}
