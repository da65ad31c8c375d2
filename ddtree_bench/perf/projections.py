"""The weight GEMMs of a verify forward one projection at a time, each against its own floor.

A verify forward's GEMM time (bench-engine's profile: the "gemm" family) is five projections of very
different sizes: per layer the merged q/k/v, o_proj, the merged gate/up and down, then lm_head once. On
the Qwen3-8B shape at n = 128 the small ones sit much further from their weight read than gate/up does
(docs/gpu-performance.md), and the profile's kernel names (cuBLAS's `nvjet_...`) do not say which
projection a kernel is. `projection_rows` times each projection alone, over every layer's weight of it
(distinct weights, as the forward streams them), on fixed random inputs:
* cublas_ms: F.linear, what the GEMM-only floor (perf/bench.gemm_only) runs;
* engine_ms: what the engine's forward launches for it (kernels/gemm.py: the device's table where it names a
  shape, `launch` says which; o_proj and down unreduced, since the forward hands a split launch's partials to
  the residual add + RMSNorm that reads them; gate/up with its SiLU epilogue), else cuBLAS again;
and its floor
    floor_ms = 1e3 * max(weight_bytes / HBM_BYTES_PER_S, 2 * params * n / DENSE_FLOP_PER_S)
with the roofline's H200 limits (perf/roofline.py); x = ms / floor_ms, GB/s = weight_bytes / engine time.
Timed as captured graphs on CUDA, eagerly elsewhere (where the figures only check the plumbing). Knows
nothing of attention or of the layer ops between the GEMMs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

from ddtree_bench.perf.roofline import DENSE_FLOP_PER_S, HBM_BYTES_PER_S

PROJECTIONS = ("qkv", "o_proj", "gate_up", "down", "lm_head")   # a layer's order, then the head


@dataclass
class ProjectionRow:
    tokens: int
    projection: str
    weights: int          # weight matrices of this projection a forward reads (one per layer; lm_head 1)
    weight_bytes: int     # all of them
    floor_ms: float       # max(bytes at HBM_BYTES_PER_S, FLOPs at DENSE_FLOP_PER_S)
    cublas_ms: float
    engine_ms: float
    launch: str           # the engine's: "cublas" (or "torch" off CUDA) or "triton BMxBNxBK splitS wW sS"
    cublas_x: float       # cublas_ms / floor_ms
    engine_x: float       # engine_ms / floor_ms
    engine_gb_s: float    # weight_bytes / engine_ms


def weights_in_order(target: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(projection, weight [N, K]) of every weight GEMM of a forward in the order it runs them: per layer q/k/v,
    o_proj, gate/up, down, then lm_head. Call after fused.merge_projections (the merged q/k/v and gate/up)."""
    out = []
    for m in target.modules():
        for name, attr in (("qkv", "qkv_weight"), ("gate_up", "gate_up_weight")):
            w = getattr(m, attr, None)
            if w is not None:
                out.append((name, w))
        for name, attr in (("o_proj", "o_proj"), ("down", "down_proj")):
            lin = getattr(m, attr, None)
            if isinstance(lin, torch.nn.Linear):
                out.append((name, lin.weight))
    out.append(("lm_head", target.lm_head.weight))
    return out


def describe(c) -> str:
    """A GemmConfig as the tuner prints it."""
    return f"triton {c.block_m}x{c.block_n}x{c.block_k} split{c.split_k} w{c.warps} s{c.stages}"


def engine_gemm(name: str, x: torch.Tensor, w: torch.Tensor) -> tuple[Callable[[], Any] | None, str]:
    """(fn, launch): the engine's kernel for projection `name` on x [n, K] and weight w, and its description;
    fn is None where the engine runs cuBLAS (no table shape for it, or not bf16 / fp16 on CUDA)."""
    from ddtree_bench.engine.gpu.kernels import gemm

    swiglu = name == "gate_up"
    n_out = w.shape[0] // 2 if swiglu else w.shape[0]
    c = gemm.config(x.shape[0], n_out, x.shape[1], x.dtype, x.device, swiglu=swiglu)
    if c is None:
        return None, "cublas" if x.device.type == "cuda" else "torch"
    if swiglu:
        return (lambda: gemm.swiglu(x, w, c)), describe(c)
    if name in ("o_proj", "down"):
        return (lambda: gemm.linear_unreduced(x, w, c)), describe(c)
    return (lambda: gemm.linear(x, w, c)), describe(c)


@torch.inference_mode()
def projection_rows(target: torch.nn.Module, tokens: list[int], device: torch.device, graphs: bool = True,
                    reps: int = 20) -> list[dict[str, Any]]:
    """One ProjectionRow (as a dict) per (n, projection), n in `tokens` order, projections in PROJECTIONS order."""
    import torch.nn.functional as F

    from ddtree_bench.perf.timing import graph_time_fn, time_fn

    groups: dict[str, list[torch.Tensor]] = {}
    for name, w in weights_in_order(target):
        groups.setdefault(name, []).append(w)
    on_graphs = graphs and device.type == "cuda"

    def timed(fns: list[Callable[[], Any]]) -> float:
        run = lambda: [f() for f in fns]  # noqa: E731
        return graph_time_fn(run, reps=reps) if on_graphs else time_fn(run, device, reps=max(3, reps // 4), warmup=1)

    rows = []
    for n in tokens:
        g = torch.Generator(device=device).manual_seed(n)
        for name in (p for p in PROJECTIONS if p in groups):
            ws = groups[name]
            x = torch.randn(n, ws[0].shape[1], device=device, generator=g).to(ws[0].dtype)
            nbytes = sum(w.numel() * w.element_size() for w in ws)
            floor = 1e3 * max(nbytes / HBM_BYTES_PER_S, 2.0 * sum(w.numel() for w in ws) * n / DENSE_FLOP_PER_S)
            cublas = timed([(lambda w=w: F.linear(x, w)) for w in ws])
            engine = [engine_gemm(name, x, w) for w in ws]
            launch = engine[0][1]
            eng = cublas if engine[0][0] is None else timed([fn for fn, _ in engine])
            rows.append(asdict(ProjectionRow(n, name, len(ws), nbytes, floor, cublas, eng, launch, cublas / floor,
                                             eng / floor, nbytes / (eng * 1e-3) / 1e9)))
    return rows
