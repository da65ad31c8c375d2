"""In-process A/B of kernel knobs on the verify forward: every arm captured and timed in one process, interleaved.

Two lent machines of one kind differ by 2-3% on the same code (docs/gpu-performance.md), so a change worth
less than that can only be judged with both arms on one GPU, close together in time. An `Arm` is a name and
environment variables (e.g. DDTREE_ROPE_TILES_FROM=1, DDTREE_GPU_EXPERIMENTAL=pdl, DDTREE_GEMM_TABLE=...) that the fused
kernels read when they launch, i.e. when a graph is captured. For each n of the curve (perf.bench.CurveSetup's
trees) `run_ab` captures one graph per arm under that arm's variables, checks its logits against the first
arm's, then times the graphs round-robin: `rounds` rounds, each replaying every arm `reps` times (the arm
order rotated each round), and reports per arm the median over rounds of the round medians, with the spread,
and, on CUDA, the median SM clock and power-capped share of the samples nvidia-smi took while that arm (or floor)
was being timed (noise/gpu_clocks.py): two arms whose clocks differ were not timed on the same card state.
On a CPU (no graphs) the same loop times eager calls, so the harness is testable anywhere.
Knows nothing of what the knobs do.
"""

from __future__ import annotations

import os
import statistics
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator

import torch

from ddtree_bench.engine.gpu.graphs import capture
from ddtree_bench.noise.gpu_clocks import ClockSampler, clock_fields, nvsmi_id, span
from ddtree_bench.perf.timing import time_fn


@dataclass(frozen=True)
class Arm:
    name: str
    env: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def parse(text: str) -> "Arm":
        """'NAME VAR=VALUE VAR=VALUE ...' (no variables: the defaults)."""
        from ddtree_bench.errors import UsageError

        parts = text.split()
        if not parts or "=" in parts[0]:
            raise UsageError(f"arm {text!r}: want 'NAME VAR=VALUE ...'")
        env = {}
        for p in parts[1:]:
            k, sep, v = p.partition("=")
            if not sep or not k:
                raise UsageError(f"arm {text!r}: {p!r} is not VAR=VALUE")
            env[k] = v
        return Arm(parts[0], env)


@contextmanager
def arm_env(arm: Arm, others: frozenset[str] = frozenset()) -> Iterator[None]:
    """The arm's variables set, and those of `others` (other arms' variables) it does not set unset, for the
    duration; the environment as it was afterwards."""
    old = {k: os.environ.get(k) for k in set(arm.env) | set(others)}
    for k in others:
        os.environ.pop(k, None)
    os.environ.update(arm.env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass
class ArmTiming:
    arm: str
    ms: float                   # median over rounds of each round's median replay
    spread_ms: float            # max - min of the round medians
    max_abs_logit_diff: float   # against the first arm's logits (0 for the first arm)
    vs_first: float             # ms / the first arm's ms
    sm_clock_mhz: float | None = None         # median SM clock of the busy samples taken while this arm was timed
    power_capped_share: float | None = None   # share of those samples with the power cap active


class _Runner:
    """One arm's forward, captured as a graph on CUDA (run() replays it), or called eagerly elsewhere."""

    def __init__(self, fn: Callable[[], Any], device: torch.device):
        self.fn, self.graph, self.out = fn, None, None
        if device.type == "cuda":
            self.graph, self.out = capture(fn)
            self.graph.replay()
        else:
            self.out = fn()

    def logits(self) -> torch.Tensor:
        return self.out[0]

    def run(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.fn()


@torch.inference_mode()
def run_ab(setup, arms: list[Arm], tokens: list[int], rounds: int = 7, reps: int = 20,
           progress: Callable[[str], None] | None = None,
           floors: dict[str, Callable[[int], Callable[[], Any]]] | None = None,
           sampler: ClockSampler | None = None) -> list[dict[str, Any]]:
    """One row per n: {"tokens", "depth", "arms": [ArmTiming as dicts], "floors": [{"name", "ms", "spread_ms",
    "sm_clock_mhz", "power_capped_share"}], "power_capped_share": over every sample of n} (see the module docstring).
    setup: a perf.bench.CurveSetup; sampler: the clocks' source (default on CUDA: nvidia-smi on this device)."""
    device = setup.device
    with ExitStack() as stack:
        if sampler is None and device.type == "cuda":
            sampler = stack.enter_context(ClockSampler(nvsmi_id(device)))
        rows = _run_ab(setup, arms, tokens, rounds, reps, progress, floors or {}, sampler)
    if progress and sampler is not None and sampler.error:
        progress(f"no clocks: {sampler.error}")
    return rows


def _run_ab(setup, arms, tokens, rounds, reps, progress, floors, sampler) -> list[dict[str, Any]]:
    device = setup.device
    rows = []
    for n in tokens:
        pt = setup.point(n, with_path=setup.ops.name == "triton")
        runners = []
        knobs = frozenset(k for a in arms for k in a.env)
        for arm in arms:
            with arm_env(arm, knobs):
                runners.append(_Runner(pt.forward(), device))
        ref = runners[0].logits().float()
        diffs = [float((r.logits().float() - ref).abs().max()) for r in runners]
        with arm_env(Arm("floor"), knobs):
            runners += [_Runner(make(n), device) for make in floors.values()]
        labels = [f"{a.name}@{n}" for a in arms] + [f"{name}@{n}" for name in floors]
        per_round: list[list[float]] = [[] for _ in runners]
        with span(sampler, f"@{n}"):
            for r in range(rounds):
                order = [(i + r) % len(runners) for i in range(len(runners))]
                for i in order:
                    with span(sampler, labels[i]):
                        per_round[i].append(time_fn(runners[i].run, device, reps=reps, warmup=0))
        meds = [statistics.median(x) for x in per_round]
        timings = [ArmTiming(a.name, m, max(x) - min(x), d, m / meds[0], **clock_fields(sampler, label))
                   for a, m, x, d, label in zip(arms, meds, per_round, diffs, labels)]
        floor_rows = [{"name": name, "ms": m, "spread_ms": max(x) - min(x), **clock_fields(sampler, label)}
                      for name, m, x, label in zip(floors, meds[len(arms):], per_round[len(arms):], labels[len(arms):])]
        rows.append({"tokens": n, "depth": pt.depth, "arms": [asdict(t) for t in timings], "floors": floor_rows,
                     "power_capped_share": clock_fields(sampler, f"@{n}")["power_capped_share"]})
        if progress:
            progress(f"n={n}: " + "  ".join(f"{t.arm} {t.ms:.3f}" for t in timings)
                     + "".join(f"  {f['name']} {f['ms']:.3f}" for f in floor_rows))
        del runners
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def table(rows: list[dict[str, Any]], roofline: Callable[[int], float] | None = None) -> str:
    """Text table: per n the depth, each arm's ms (and x the first arm), its round spread, and the largest
    logit difference against the first arm; with `roofline` (n -> ms) also each arm's ratio to it; with floors
    (run_ab's), each floor's ms and every arm's ratio to the first floor ("/<floor>"); where clocks were sampled,
    each arm's and floor's median SM clock ("<arm> MHz") and the share of n's samples at the power cap ("capped %")."""
    if not rows:
        return ""
    clocked = any(t.get("sm_clock_mhz") is not None for r in rows for t in [*r["arms"], *r.get("floors", [])])
    names = [a["arm"] for a in rows[0]["arms"]]
    floor_names = [f["name"] for f in rows[0].get("floors", [])]
    head = ["tokens", "depth"] + [f"{a} ms" for a in names] + [f"{a} x" for a in names[1:]]
    head += [f"{f} ms" for f in floor_names] + ([f"{a} /{floor_names[0]}" for a in names] if floor_names else [])
    if roofline:
        head += [f"{a} /roof" for a in names]
    if clocked:
        head += [f"{a} MHz" for a in names + floor_names] + ["capped %"]
    head += ["spread ms", "max |dlogit|"]
    lines = [head]
    for r in rows:
        arms, floors = r["arms"], r.get("floors", [])
        cells = [str(r["tokens"]), str(r["depth"])] + [f"{a['ms']:.3f}" for a in arms]
        cells += [f"{a['vs_first']:.3f}" for a in arms[1:]]
        cells += [f"{f['ms']:.3f}" for f in floors]
        cells += [f"{a['ms'] / floors[0]['ms']:.3f}" for a in arms] if floors else []
        if roofline:
            cells += [f"{a['ms'] / roofline(r['tokens']):.3f}" for a in arms]
        if clocked:
            cells += [_cell(t.get("sm_clock_mhz"), "{:.0f}") for t in [*arms, *floors]]
            cells += [_cell(r.get("power_capped_share"), "{:.0%}")]
        cells += [f"{max(a['spread_ms'] for a in [*arms, *floors]):.3f}",
                  f"{max(a['max_abs_logit_diff'] for a in arms):.3g}"]
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in lines)


def _cell(x: float | None, fmt: str) -> str:
    return "-" if x is None else fmt.format(x).rstrip("%")


__all__ = ["Arm", "ArmTiming", "arm_env", "run_ab", "table"]
