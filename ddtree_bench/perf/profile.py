"""Per-kernel profile of one piece of device work: which kernels a forward spends its time in.

`profile_kernels(fn, device)` runs fn `reps` times under torch.profiler - on CUDA as replays of one
captured CUDA graph (what the engine runs; CUDA activity only), eagerly if the graph's kernels are not
traced; on a CPU the ATen ops' self time - and returns a `KernelProfile`: one `KernelTime` per kernel
name, largest first, with
    ms      = summed device time of the name / reps          (per call of fn)
    launches = launches of the name / reps
    share   = ms / kernel_ms,  kernel_ms = sum of ms over every name
and the same per `family` (gemm, attention, layer_ops, elementwise, other: a rule on the name, so
each gap between a forward and its roofline has a name). `gap_ms = wall_ms - kernel_ms` is the time
the device sat idle between kernels (launch latency, bubbles) when wall_ms, the measured time per
call, is given. On CUDA `gaps` says where that idle time falls (`kernel_gaps`): per pair of consecutive
kernels inside one call (previous -> next), the device ms per call between the end of every kernel before
the next one and its start, largest first; `gaps_ms` is their sum (wall_ms - kernel_ms also holds the
call's own start and end). Knows nothing of models or of what the work is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

import torch

FAMILIES = ("gemm", "attention", "layer_ops", "elementwise", "other")
_RULES = (  # first match wins; lower-case substrings of kernel (or ATen op) names
    ("attention", ("_live_attn", "_tree_attn", "_combine_kernel", "flash", "fmha", "attention", "sdpa", "softmax")),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "splitk", "aten::mm", "aten::addmm", "aten::linear",
              "aten::matmul", "aten::bmm")),
    ("layer_ops", ("_rmsnorm_kernel", "_qkv_rope", "_silu_mul_kernel")),   # _qkv_rope_kernel, _qkv_rope_tiles_kernel
    ("elementwise", ("elementwise", "vectorized", "reduce", "index", "copy", "fill", "cat", "aten::")),
)


def family(name: str) -> str:
    """The family of a kernel name (FAMILIES), by the first rule whose substring it contains."""
    low = name.lower()
    for fam, keys in _RULES:
        if any(k in low for k in keys):
            return fam
    return "other"


@dataclass
class KernelTime:
    name: str
    family: str
    ms: float          # device ms per call of the profiled function
    launches: float    # launches per call
    share: float       # of kernel_ms


@dataclass
class GapTime:
    after: str         # the kernel that had ended
    before: str        # the kernel the device then waited to start
    ms: float          # idle device ms per call between the two (summed over the call's occurrences)
    count: float       # occurrences per call


def kernel_gaps(spans: Iterable[tuple[str, float, float]], reps: int) -> list[GapTime]:
    """Idle time between consecutive kernels inside each call, from (name, start_us, end_us) device spans of
    `reps` calls that launch the same kernels (graph replays): the spans in start order are cut into reps equal
    runs, and kernel i of a run waited max(0, start_i - the latest end before it in that run). Per (after,
    before) name pair, ms and count per call, largest first; [] when the spans do not split into equal runs."""
    spans = sorted(spans, key=lambda s: (s[1], s[2]))
    if reps < 1 or not spans or len(spans) % reps:
        return []
    per = len(spans) // reps
    us: dict[tuple[str, str], float] = {}
    n: dict[tuple[str, str], int] = {}
    for r in range(reps):
        run = spans[r * per:(r + 1) * per]
        end = run[0][2]
        for prev, cur in zip(run, run[1:]):
            key = (prev[0], cur[0])
            us[key] = us.get(key, 0.0) + max(0.0, cur[1] - end)
            n[key] = n.get(key, 0) + 1
            end = max(end, cur[2])
    rows = [GapTime(a, b, t / 1e3 / reps, n[(a, b)] / reps) for (a, b), t in us.items()]
    rows.sort(key=lambda g: (-g.ms, g.after, g.before))
    return rows


@dataclass
class KernelProfile:
    source: str                        # graph | eager | cpu
    reps: int
    kernel_ms: float                   # summed kernel time per call
    kernels: list[KernelTime]          # largest first
    families_ms: dict[str, float] = field(default_factory=dict)
    wall_ms: float | None = None       # the measured time per call, when given
    gap_ms: float | None = None        # wall_ms - kernel_ms
    gaps: list[GapTime] = field(default_factory=list)   # idle between kernel pairs inside a call (CUDA), largest first
    gaps_ms: float | None = None       # their sum per call

    def top(self, k: int) -> list[KernelTime]:
        return self.kernels[:k]

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        d = asdict(self)
        if top is not None:
            d["kernels"] = d["kernels"][:top]
            d["kernels_total"] = len(self.kernels)
            d["gaps"] = d["gaps"][:top]
            d["gaps_total"] = len(self.gaps)
        return d


def kernel_profile(events: Iterable[tuple[str, float, int]], reps: int, source: str,
                   wall_ms: float | None = None, spans: Iterable[tuple[str, float, float]] | None = None) -> KernelProfile:
    """Fold (name, device microseconds, launches) events from `reps` calls into a KernelProfile; spans
    ((name, start_us, end_us) of the same kernels) add its gaps (kernel_gaps)."""
    us: dict[str, float] = {}
    n: dict[str, int] = {}
    for name, t_us, count in events:
        us[name] = us.get(name, 0.0) + t_us
        n[name] = n.get(name, 0) + count
    total_ms = sum(us.values()) / 1e3 / reps
    rows = [KernelTime(name, family(name), t / 1e3 / reps, n[name] / reps,
                       (t / 1e3 / reps) / total_ms if total_ms > 0 else 0.0) for name, t in us.items()]
    rows.sort(key=lambda r: (-r.ms, r.name))
    fams = {f: 0.0 for f in FAMILIES}
    for r in rows:
        fams[r.family] += r.ms
    gap = None if wall_ms is None else wall_ms - total_ms
    gaps = kernel_gaps(spans, reps) if spans is not None else []
    return KernelProfile(source, reps, total_ms, rows, fams, wall_ms, gap, gaps,
                         sum(g.ms for g in gaps) if spans is not None else None)


def _cuda_spans(prof) -> list[tuple[str, float, float]]:
    """(name, start_us, end_us) of every CUDA kernel (and memset / memcpy) the profiler saw."""
    from torch.autograd import DeviceType

    return [(e.name, e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == DeviceType.CUDA]


def _cuda_profile(prof, reps: int, source: str, wall_ms: float | None) -> KernelProfile | None:
    spans = _cuda_spans(prof)
    if not spans:
        return None
    return kernel_profile([(n, e - s, 1) for n, s, e in spans], reps, source, wall_ms, spans)


def _cpu_events(prof) -> list[tuple[str, float, int]]:
    return [(a.key, a.self_cpu_time_total, a.count) for a in prof.key_averages()
            if not a.key.startswith("ProfilerStep") and a.self_cpu_time_total > 0]


def _profiled(run: Callable[[], Any], reps: int, activities) -> Any:
    from torch.profiler import profile

    with profile(activities=activities) as prof:  # CPU too: some builds attach kernels to their CPU launches
        for _ in range(reps):
            run()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    return prof


def profile_kernels(fn: Callable[[], Any], device: torch.device, reps: int = 5, graph: bool = True,
                    wall_ms: float | None = None) -> KernelProfile:
    """KernelProfile of `reps` calls of fn after a warmup: CUDA-graph replays (graph=True on CUDA), else eager
    calls; on a CPU the ATen ops' self times."""
    from torch.profiler import ProfilerActivity

    if device.type != "cuda":
        fn()
        return kernel_profile(_cpu_events(_profiled(fn, reps, [ProfilerActivity.CPU])), reps, "cpu", wall_ms)
    if graph:
        from ddtree_bench.engine.gpu.graphs import Stage

        stage = Stage(fn, device, name="profile")
        stage.run()                       # warmup + capture + one replay
        torch.cuda.synchronize()
        try:
            p = _cuda_profile(_profiled(stage.run, reps, [ProfilerActivity.CPU, ProfilerActivity.CUDA]), reps, "graph", wall_ms)
        finally:
            stage.release()
        if p is not None:
            return p
    fn()
    torch.cuda.synchronize()
    p = _cuda_profile(_profiled(fn, reps, [ProfilerActivity.CPU, ProfilerActivity.CUDA]), reps, "eager", wall_ms)
    return p if p is not None else kernel_profile([], reps, "eager", wall_ms)
