"""What the GPU's clocks and power did while something was timed: nvidia-smi sampled beside a measurement.

A GPU at its power limit lowers its SM clock, and how far depends on what it runs: tensor-core GEMMs draw more on
random data than on smooth data, so the same kernels time differently by input, by arm and by lease (measured on an
H100: docs/gpu-performance.md, "2026-12-07 07:53-08:40 UTC"). A timing without its clock cannot say whether a change
made the kernels faster or only the card cooler. `ClockSampler(gpu_id)` (`nvsmi_id(device)`; None: every GPU)
runs one `nvidia-smi --query-gpu=... -lms <interval>` process for its lifetime (one process, not one a sample; on
Linux it dies with the process that started it, however that ends), stamps each line with the host's monotonic clock
on arrival, and `span(label)` marks the stretches a label's work ran, so
`summary(label)` describes only the samples taken inside them (samples land within ~the interval of the truth).
A sample is busy unless the driver reports the GPU idle (reason bit 0x1); shares are of busy samples:
    power_capped_share = busy samples with the SW power cap reason (0x4) / busy samples
    thermal_share      = busy samples with a thermal or HW slowdown reason (0x8, 0x20, 0x40, 0x80) / busy samples
and the clock and power figures are medians over busy samples. Without nvidia-smi, or where it refuses the query,
`summary` is None and `error` says why: a probe never fails a benchmark. Knows nvidia-smi's CSV; nothing of what
is timed.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time
from collections import defaultdict
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass
from typing import Any
from typing import Callable, Iterator

from ddtree_bench import defaults as D

FIELDS = ("clocks.sm", "clocks.max.sm", "power.draw", "power.limit", "temperature.gpu", "clocks_throttle_reasons.active")
REASON_IDLE = 0x1
REASON_SW_POWER_CAP = 0x4
REASONS_THERMAL = 0x8 | 0x20 | 0x40 | 0x80   # HW slowdown, SW thermal, HW thermal, HW power brake


@dataclass(frozen=True)
class ClockSample:
    t_s: float                     # host monotonic seconds when the line arrived
    sm_clock_mhz: float | None
    sm_clock_max_mhz: float | None
    power_w: float | None
    power_limit_w: float | None
    temperature_c: float | None
    reasons: int | None            # the clocks event reasons bit mask (None where the driver does not say)

    @property
    def busy(self) -> bool:
        return self.reasons is None or not self.reasons & REASON_IDLE


@dataclass(frozen=True)
class ClockSummary:
    samples: int                   # samples inside the label's spans
    busy_samples: int
    sm_clock_mhz_median: float | None
    sm_clock_mhz_min: float | None
    sm_clock_max_mhz: float | None   # the card's maximum SM clock
    power_w_median: float | None
    power_limit_w: float | None
    power_capped_share: float | None
    thermal_share: float | None


def cell_number(cell: str) -> float | None:
    """An nvidia-smi or /proc cell's leading number ('1980 MHz' -> 1980.0); None for '[N/A]', blanks and words."""
    try:
        return float(cell.strip().split()[0])
    except (ValueError, IndexError):
        return None


def parse_line(line: str, t_s: float) -> ClockSample | None:
    """One `--format=csv,noheader,nounits` line of FIELDS -> a sample ('[N/A]' cells None); None if not such a line."""
    cells = [c.strip() for c in line.split(",")]
    if len(cells) != len(FIELDS):
        return None
    sm, sm_max, power, limit, temp, reasons = cells
    try:
        mask = int(reasons, 16) if reasons.lower().startswith("0x") else None
    except ValueError:
        mask = None
    n = cell_number
    sample = ClockSample(t_s, n(sm), n(sm_max), n(power), n(limit), n(temp), mask)
    return sample if sample.sm_clock_mhz is not None or sample.power_w is not None else None


def summarize(samples: list[ClockSample]) -> ClockSummary | None:
    """The module docstring's figures over `samples`; None for no samples."""
    if not samples:
        return None
    busy = [s for s in samples if s.busy]

    def med(xs):
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None

    def share(bit: int) -> float | None:
        known = [s for s in busy if s.reasons is not None]
        return sum(1 for s in known if s.reasons & bit) / len(known) if known else None

    clocks = [s.sm_clock_mhz for s in busy if s.sm_clock_mhz is not None]
    return ClockSummary(len(samples), len(busy), med(clocks), min(clocks) if clocks else None,
                        med(s.sm_clock_max_mhz for s in samples), med(s.power_w for s in busy),
                        med(s.power_limit_w for s in samples), share(REASON_SW_POWER_CAP), share(REASONS_THERMAL))


def nvsmi_id(device) -> str | None:
    """nvidia-smi's -i for a torch CUDA device: its UUID (CUDA ordinals need not follow nvidia-smi's order)."""
    try:
        import torch

        uuid = torch.cuda.get_device_properties(device).uuid
        return f"GPU-{uuid}" if uuid else None
    except Exception:   # noqa: BLE001 - a probe: no UUID means no id
        return None


def _die_with_parent() -> Callable[[], None] | None:
    """What the child runs before exec (Linux): prctl(PR_SET_PDEATHSIG, SIGTERM), so the sampler's nvidia-smi goes
    when the process that started it dies - a benchmark killed by `timeout` or SIGKILL runs no __exit__, and a pipe
    a forked worker still holds would keep a bare nvidia-smi looping. Looked up here, in the parent, so the forked
    child runs one foreign call and no import; None where there is no prctl (not Linux). The kernel sends the signal
    when the *thread* that forked ends, so enter a sampler from a thread that outlives it (every caller here: the
    main one)."""
    try:
        import ctypes
        import signal

        prctl, sigterm = ctypes.CDLL(None, use_errno=True).prctl, int(signal.SIGTERM)
    except Exception:   # noqa: BLE001 - no libc with prctl: nothing to set
        return None
    return lambda: prctl(1, sigterm)   # PR_SET_PDEATHSIG = 1


class ClockSampler:
    """nvidia-smi streaming FIELDS every `interval_ms` for the sampler's life (a context manager)."""

    def __init__(self, gpu_id: str | None = None, interval_ms: int = D.GPU_CLOCK_SAMPLE_MS, exe: str | None = None):
        self.gpu_id, self.interval_ms = gpu_id, interval_ms
        self.exe = exe or shutil.which("nvidia-smi")
        self.samples: list[ClockSample] = []
        self.spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
        self.error: str | None = None if self.exe else "nvidia-smi not found"
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> ClockSampler:
        if self.exe:
            cmd = [self.exe, f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits",
                   "-lms", str(self.interval_ms)] + (["-i", self.gpu_id] if self.gpu_id else [])
            try:
                self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                              preexec_fn=_die_with_parent())
            except (OSError, subprocess.SubprocessError) as e:   # a preexec failure is a SubprocessError
                self.error = f"nvidia-smi did not start: {e}"
            else:
                self._reader = threading.Thread(target=self._read, daemon=True)
                self._reader.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        other = None
        for line in self._proc.stdout:
            s = parse_line(line, time.monotonic())
            if s is not None:
                self.samples.append(s)
            elif line.strip() and other is None:
                other = line.strip()
        if not self.samples and other:
            self.error = f"nvidia-smi: {other[:200]}"

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=D.ENV_PROBE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=D.ENV_PROBE_TIMEOUT_S)
        if self._proc is not None and not self.samples and self.error is None:
            self.error = f"nvidia-smi gave no sample (exit {self._proc.returncode})"

    @contextmanager
    def span(self, label: str) -> Iterator[None]:
        """Mark the work inside the block as `label`'s (spans of one label may repeat, e.g. one per round)."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.spans[label].append((t0, time.monotonic()))

    def summary(self, label: str | None = None) -> ClockSummary | None:
        """Over every sample (label None) or those inside `label`'s spans; None where there are none."""
        if label is None:
            return summarize(list(self.samples))
        spans = self.spans.get(label, [])
        return summarize([s for s in list(self.samples) if any(a <= s.t_s <= b for a, b in spans)])


def span(sampler: ClockSampler | None, label: str) -> AbstractContextManager:
    """sampler.span(label), or nothing where there is no sampler (off CUDA)."""
    return sampler.span(label) if sampler is not None else nullcontext()


def summary_dict(sampler: ClockSampler | None, label: str | None = None) -> dict[str, Any] | None:
    """sampler.summary(label) as a plain dict (what a JSON result stores); None without a sampler or samples."""
    s = sampler.summary(label) if sampler is not None else None
    return asdict(s) if s is not None else None


def clock_fields(sampler: ClockSampler | None, label: str | None = None) -> dict[str, float | None]:
    """The two figures a table row carries: {"sm_clock_mhz": the median busy SM clock, "power_capped_share"}."""
    s = sampler.summary(label) if sampler is not None else None
    return {"sm_clock_mhz": s.sm_clock_mhz_median if s else None, "power_capped_share": s.power_capped_share if s else None}
