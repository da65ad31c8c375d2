"""The weight GEMMs of a forward over few rows (x @ W^T with M <= GEMM_MAX_ROWS), as one Triton kernel.

A verify or decode forward of n <= 256 tokens reads every weight once and does little arithmetic with
it: the weight GEMMs are bound by HBM bandwidth, and what decides their time is how evenly the
weight bytes spread over the SMs and how many of them are in flight. `linear(x, w, launch)` tiles
the output [M, N] in BLOCK_M x BLOCK_N tiles (usually one row block covers every row; where several
do, the row blocks of one weight tile are adjacent in launch order, so the second reads it from L2) and
optionally splits K into `split_k` ranges, so that a [4096, 4096] projection still has >= one program
per SM; each program streams its [BLOCK_N, K / split_k] slice of W through a `stages`-deep pipeline
and accumulates in fp32 on the tensor cores. With split_k > 1 the programs write fp32 partials and
`_gemm_split_reduce` sums them (in range order, so the result does not depend on scheduling);
`linear_unreduced` hands them on instead (`SplitSums`), for the residual add + RMSNorm that reads the
projection to sum (layer_ops.TritonOps.linear_add_rmsnorm, the default). With PDL (kernels/pdl.py) a
program first prefetches its weight slice into L2, then waits for the kernel before it.

`swiglu(x, gate_up, launch)` is the MLP's first GEMM with its activation in the epilogue: gate_up
[2I, K] is the merged [gate | up] weight (fused.merge_projections); a program computes the gate tile
and the up tile of the same columns and writes silu(gate) * up [M, I] (the SiLU rounded where
PyTorch rounds it: ops.TorchOps.silu_mul on the GEMM's rounded output), so the [M, 2I] intermediate
and the separate SiLU kernel are gone.

Twins: F.linear, and ops.TorchOps.silu_mul(F.linear(x, gate_up)); results agree up to fp32 summation
order before the one rounding to the activation dtype. Launch shapes come from a tuning table per card (`config`:
an H200's, an H100 SXM's; measured by benchmarks/gpu_gemm_tune.py; docs/gpu-performance.md); shapes the table does
not name, and cards outside sm_90, run cuBLAS (`config` returns None). bf16 / fp16 only (fp32 keeps cuBLAS's IEEE
products).
The launch shape, the SwiGLU epilogue and the split-K partials and their reduce live in kernels/gemm_parts.py.
Knows nothing of models: only x [M, K] (last dim contiguous) and a row-major weight [N, K].
"""

from __future__ import annotations

import json
import os
from functools import lru_cache

import torch

from ddtree_bench.engine.gpu.kernels import experimental, pdl
from ddtree_bench.engine.gpu.kernels.common import is_h100_sxm, tl, triton
from ddtree_bench.engine.gpu.kernels.gemm_parts import KERNELS, REDUCE_BLOCK, GemmConfig, SplitSums  # noqa: F401

if triton is not None:   # the kernels exist only with Triton (common.py); without it this module still imports
    from ddtree_bench.engine.gpu.kernels.gemm_parts import _gemm_split_reduce, _store_tile  # noqa: F401
from ddtree_bench.engine.gpu.kernels.warm import launch as _launch

GEMM_MAX_ROWS = 256   # above this the GEMMs are compute-bound and cuBLAS's large tiles win


if triton is not None:

    @triton.jit
    def _gemm_kernel(X, W, Y, M, N, K, k_per_split, up_rows, sx, sw, sy, s_split, prefetch_k,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     SWIGLU: tl.constexpr, PARTIAL: tl.constexpr, EVEN_K: tl.constexpr, PRECISION: tl.constexpr,
                     USE_GDC: tl.constexpr, LINE: tl.constexpr, GDC_LATE: tl.constexpr = False):
        pid_m = tl.program_id(0)   # row blocks vary fastest: the blocks of one weight tile run side by side (L2 hits)
        pid_n = tl.program_id(1)
        pid_k = tl.program_id(2)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        m_ok = rm < M
        n_ok = rn < N
        k0 = pid_k * k_per_split
        k_end = tl.minimum(k0 + k_per_split, K)
        if USE_GDC:   # the weight slice's first prefetch_k columns into L2 while the previous kernel runs
            pf_end = tl.minimum(k0 + prefetch_k, k_end)
            rl = tl.arange(0, 8) * LINE
            for kk in range(k0, pf_end, 8 * LINE):
                ok_pf = n_ok[:, None] & ((kk + rl) < pf_end)[None, :]
                p = W + rn[:, None] * sw + (kk + rl)[None, :]
                pdl.prefetch_l2(tl.where(ok_pf, p, W))
                if SWIGLU:
                    pdl.prefetch_l2(tl.where(ok_pf, p + up_rows * sw, W))
        pdl.enter(USE_GDC, GDC_LATE)
        xp = X + rm[:, None] * sx + (k0 + rk)[None, :]
        wp = W + rn[:, None] * sw + (k0 + rk)[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(k0, k_end, BLOCK_K):
            if EVEN_K:
                x = tl.load(xp, mask=m_ok[:, None], other=0.0)
                w = tl.load(wp, mask=n_ok[:, None], other=0.0)
            else:
                k_ok = (k + rk) < k_end
                x = tl.load(xp, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
                w = tl.load(wp, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
            if SWIGLU:
                if EVEN_K:
                    wu = tl.load(wp + up_rows * sw, mask=n_ok[:, None], other=0.0)
                else:
                    wu = tl.load(wp + up_rows * sw, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
                acc_up = tl.dot(x, tl.trans(wu), acc_up, input_precision=PRECISION)
            xp += BLOCK_K
            wp += BLOCK_K
        pdl.release(USE_GDC, GDC_LATE)
        _store_tile(Y, acc, acc_up, rm, rn, m_ok[:, None] & n_ok[None, :], pid_k, s_split, sy, up_rows, SWIGLU, PARTIAL)

L2_PREFETCH_BYTES = 24 << 20   # what one GEMM's programs together prefetch into L2 ahead of their loop (of 50 MB)


def _prefetch_k(n_programs: int, block_n: int, k_per_split: int, elem: int, swiglu: bool, line: int) -> int:
    """K columns each program prefetches: an even share of L2_PREFETCH_BYTES, whole lines, at most its range."""
    per = L2_PREFETCH_BYTES // max(1, n_programs) // (block_n * elem * (2 if swiglu else 1))
    return max(0, min(k_per_split, per // line * line))


def _run(x: torch.Tensor, w: torch.Tensor, n_out: int, up_rows: int, launch: GemmConfig,
         reduce: bool = True) -> torch.Tensor | SplitSums:
    """Launch the kernel for out [M, n_out] (swiglu when up_rows > 0: the up weight rows start at up_rows);
    reduce=False leaves a split launch's partials unreduced (SplitSums)."""
    if launch.kernel not in KERNELS:
        raise ValueError(f"unknown GEMM kernel {launch.kernel!r}: {' | '.join(KERNELS)}")
    M, K = x.shape
    c = launch
    split = max(1, min(c.split_k, triton.cdiv(K, c.block_k)))
    k_per_split = triton.cdiv(triton.cdiv(K, split), c.block_k) * c.block_k
    split = triton.cdiv(K, k_per_split)
    y = torch.empty((M, n_out), dtype=x.dtype, device=x.device)
    swiglu = up_rows > 0
    grid = (triton.cdiv(M, c.block_m), triton.cdiv(n_out, c.block_n), split)
    even = K % c.block_k == 0
    prec = "ieee" if x.dtype == torch.float32 else "tf32"   # fp32 (the tests' twin check) multiplies exactly
    gdc = pdl.gdc_options(x.device, M)
    line = 128 // x.element_size()
    pf = _prefetch_k(grid[1] * split, c.block_n, k_per_split, x.element_size(), swiglu, line) if pdl.prefetch(x.device) else 0
    opts = dict(LINE=line, num_warps=c.warps, num_stages=c.stages, **gdc)
    if split == 1:
        _launch(_gemm_kernel, grid, x, w, y, M, n_out, K, k_per_split, up_rows, x.stride(0), w.stride(0), y.stride(0), 0,
                pf, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, SWIGLU=swiglu, PARTIAL=False,
                EVEN_K=even, PRECISION=prec, **opts)
        return y
    width = n_out * (2 if swiglu else 1)
    part = torch.empty((split, M, width), dtype=torch.float32, device=x.device)
    _launch(_gemm_kernel, grid, x, w, part, M, n_out, K, k_per_split, n_out if swiglu else 0, x.stride(0), w.stride(0),
            part.stride(1), part.stride(0), pf, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
            SWIGLU=swiglu, PARTIAL=True, EVEN_K=even, PRECISION=prec, **opts)
    if not reduce:
        return SplitSums(part, x.dtype)
    _launch(_gemm_split_reduce, (M, triton.cdiv(n_out, REDUCE_BLOCK)),
            part, y, n_out, split, n_out if swiglu else 0, part.stride(0), part.stride(1), y.stride(0),
            SWIGLU=swiglu, BLOCK=REDUCE_BLOCK, num_warps=4, **gdc)
    return y


def _check(x: torch.Tensor, w: torch.Tensor) -> None:
    if x.dim() != 2 or x.stride(-1) != 1 or w.stride(-1) != 1 or x.shape[1] != w.shape[1]:
        raise ValueError(f"gemm needs x [M, K] and w [N, K] with contiguous rows, got {tuple(x.shape)} and {tuple(w.shape)}")


def linear(x: torch.Tensor, w: torch.Tensor, launch: GemmConfig) -> torch.Tensor:
    """x [M, K] @ w[N, K]^T -> [M, N] in x's dtype (F.linear without bias)."""
    _check(x, w)
    return _run(x, w, w.shape[0], 0, launch)


def linear_unreduced(x: torch.Tensor, w: torch.Tensor, launch: GemmConfig) -> torch.Tensor | SplitSums:
    """linear, except that a split launch returns its SplitSums instead of reducing them."""
    _check(x, w)
    return _run(x, w, w.shape[0], 0, launch, reduce=False)


def swiglu(x: torch.Tensor, gate_up: torch.Tensor, launch: GemmConfig) -> torch.Tensor:
    """x [M, K], gate_up [2I, K] = [gate | up] -> silu(x @ gate^T) * (x @ up^T) [M, I]."""
    _check(x, gate_up)
    if gate_up.shape[0] % 2:
        raise ValueError(f"swiglu needs an even number of gate_up rows, got {gate_up.shape[0]}")
    i = gate_up.shape[0] // 2
    return _run(x, gate_up, i, i, launch)


# ---------------------------------------------------------------------------- the tuning table

Table = dict[tuple[int, int, bool], tuple[tuple[int, GemmConfig | None], ...]]

# (N, K, swiglu) -> ((max rows, launch shape or None for cuBLAS), ...) for the Qwen3-8B shape's projections on
# an H200: per row band (rows above the previous band's max, up to this max) the fastest Triton shape where it
# beat cuBLAS, else None (benchmarks/gpu_gemm_tune.py; docs/gpu-performance.md). N of a swiglu entry is I
# (the output width); rows above a shape's last band, and shapes not listed, run cuBLAS.
# Provenance per band, docs/measurements/: 2026-12-01/h200-d/gemm1 (q/k/v, lm_head, o_proj's 1-8 rows); 2026-12-03/
# h200-speed-f/b-bands (the 17-row band: a B = 16 tree's B + 1 nodes; 34- and 66-row bands lost or tied in the
# forward); 2026-12-03/h200-speed-g (2-, 4-, 8-row bands); 2026-12-04/h200-speed-m/a-tune (o_proj's 18-32, down's
# 9-16, 18-32 and 65-128, gate/up's 18-32: tuned with the residual add + RMSNorm that reads o_proj / down; the 17-row
# band of down is the 64-row shape, which won the forward at 17 rows over the tuner's pick); above 128 rows cuBLAS
# won every band (h200-speed-g, and h200-speed-m/d-above128 with the norm-aware tuner).
H200_TABLE: Table = {
    (6144, 4096, False): ((1, None), (4, GemmConfig(16, 32, 128, 1, 4, 5))),                       # q/k/v
    (4096, 4096, False): ((1, GemmConfig(16, 64, 128, 2, 4, 5)), (8, GemmConfig(16, 32, 128, 1, 4, 5)),
                          (16, GemmConfig(16, 32, 128, 2, 4, 5)), (17, GemmConfig(32, 32, 128, 2, 4, 5)),
                          (32, GemmConfig(32, 32, 128, 2, 4, 5))),                                  # o_proj
    (4096, 12288, False): ((2, GemmConfig(16, 32, 128, 3, 4, 4)), (4, GemmConfig(16, 64, 128, 4, 4, 4)),
                           (8, GemmConfig(16, 32, 128, 3, 4, 4)), (16, GemmConfig(16, 32, 128, 2, 4, 5)),
                           (17, GemmConfig(64, 64, 128, 2, 4, 5)), (32, GemmConfig(32, 128, 128, 3, 4, 4)),
                           (64, GemmConfig(64, 64, 128, 2, 4, 5)), (128, GemmConfig(64, 128, 128, 2, 4, 4))),  # down
    (12288, 4096, True): ((16, GemmConfig(16, 32, 128, 1, 4, 3)), (17, GemmConfig(32, 32, 128, 1, 4, 3)),
                          (32, GemmConfig(32, 64, 128, 1, 4, 3)), (64, GemmConfig(64, 64, 64, 1, 4, 4))),  # gate/up + SiLU
    (151936, 4096, False): ((8, GemmConfig(16, 128, 128, 1, 4, 3)), (16, GemmConfig(16, 128, 128, 1, 8, 3)),
                            (32, GemmConfig(32, 128, 128, 1, 4, 4))),                               # lm_head
}

# The same for an H100 SXM (80 GB HBM3; 132 SMs at 3.35 TB/s against the H200's 4.8), tuned there with the same tuner
# (docs/measurements/2026-12-05/h100-m-table-tune): up to 64 rows the tuner's picks; above, cuBLAS, which an H100 calls
# through cuBLASLt (ops.lt_gemms; down's 65-128 rows left the H200 table's band for it on 2026-12-06). In one process on
# the H100 it took the verify 0.977-0.996x of the H200 table's at n = 1-64 and a batched round of two 0.978-0.987x
# (docs/gpu-performance.md, "Evening (H100, 2026-12-05)" and "2026-12-06 13:09-13:27 UTC").
H100_TABLE: Table = {
    (6144, 4096, False): ((1, GemmConfig(16, 128, 128, 1, 4, 5)), (2, GemmConfig(16, 64, 256, 1, 4, 3)),
                          (8, GemmConfig(16, 32, 128, 1, 4, 5)), (16, GemmConfig(16, 64, 128, 1, 4, 5)),
                          (17, GemmConfig(16, 128, 128, 1, 4, 5)), (32, GemmConfig(32, 64, 128, 1, 4, 5))),  # q/k/v
    (4096, 4096, False): ((1, GemmConfig(16, 32, 128, 2, 4, 5)), (16, GemmConfig(16, 32, 128, 2, 4, 4))),     # o_proj
    (4096, 12288, False): ((1, GemmConfig(16, 32, 128, 3, 4, 4)), (2, GemmConfig(16, 32, 128, 4, 4, 3)),
                           (16, GemmConfig(16, 64, 128, 4, 4, 3)), (17, GemmConfig(32, 128, 128, 3, 4, 4)),
                           (32, GemmConfig(32, 32, 256, 2, 4, 3)), (64, GemmConfig(64, 64, 128, 2, 4, 5)),
                           (128, None)),                                                                   # down
    (12288, 4096, True): ((1, GemmConfig(16, 32, 128, 1, 4, 3)), (8, GemmConfig(16, 32, 128, 1, 4, 4)),
                          (16, GemmConfig(16, 32, 128, 1, 4, 3)), (17, GemmConfig(16, 64, 256, 1, 4, 2)),
                          (32, GemmConfig(32, 32, 128, 1, 4, 3)), (64, GemmConfig(64, 64, 128, 1, 4, 4))),  # gate/up + SiLU
    (151936, 4096, False): ((2, GemmConfig(16, 128, 256, 1, 4, 3)), (16, GemmConfig(16, 128, 128, 1, 4, 5)),
                            (32, GemmConfig(32, 128, 128, 1, 4, 5)), (64, GemmConfig(64, 128, 128, 1, 4, 3))),  # lm_head
}

TUNED_CAPABILITY = (9, 0)   # both tables were measured on sm_90; elsewhere cuBLAS unless TABLE_ENV names a table
TABLE_ENV = experimental.GEMM_TABLE_ENV   # a JSON table written by benchmarks/gpu_gemm_tune.py --write, used on any CUDA device
_LOADED: dict[str, Table] = {}


def table_from_json(doc: dict) -> Table:
    """{"entries": [{"n", "k", "swiglu", "max_rows", "config": GemmConfig fields or null}, ...]} -> a Table (bands sorted)."""
    from ddtree_bench.errors import UsageError

    table: dict[tuple[int, int, bool], list[tuple[int, GemmConfig | None]]] = {}
    try:
        for e in doc["entries"]:
            launch = None if e["config"] is None else GemmConfig(**{k: str(v) if k == "kernel" else int(v)
                                                                     for k, v in e["config"].items()})
            if launch is not None and (min(launch.block_m, launch.block_n, launch.block_k) < 16 or launch.split_k < 1
                                       or any(b & (b - 1) for b in (launch.block_m, launch.block_n, launch.block_k))
                                       or launch.kernel not in KERNELS):
                raise ValueError(f"bad launch shape {launch}")
            table.setdefault((int(e["n"]), int(e["k"]), bool(e["swiglu"])), []).append((int(e["max_rows"]), launch))
    except (KeyError, TypeError, ValueError) as err:
        raise UsageError(f"{TABLE_ENV}: not a GEMM table ({type(err).__name__}: {err})",
                         hint="write one with: python benchmarks/gpu_gemm_tune.py --write table.json") from None
    return {key: tuple(sorted(bands, key=lambda b: b[0])) for key, bands in table.items()}


def table_to_json(table: Table) -> dict:
    from dataclasses import asdict

    def fields(c: GemmConfig) -> dict:   # "kernel" only where it is not the default, as tables before it had
        return {k: v for k, v in asdict(c).items() if k != "kernel" or v != "tiles"}

    return {"entries": [{"n": n, "k": k, "swiglu": sw, "max_rows": rows, "config": None if c is None else fields(c)}
                        for (n, k, sw), bands in sorted(table.items()) for rows, c in bands]}


def _env_table() -> Table | None:
    path = os.environ.get(TABLE_ENV)
    if not path:
        return None
    if path not in _LOADED:
        from ddtree_bench.errors import UsageError

        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise UsageError(f"{TABLE_ENV}={path}: cannot read it as JSON ({err})") from None
        _LOADED[path] = table_from_json(doc)
    return _LOADED[path]


def merged(base: Table, over: dict, bands: tuple[int, ...] | list[int] = ()) -> Table:
    """`base` with the bands of `over` ((N, K, swiglu) -> [(max rows, launch or None), ...]) laid over it: a tuning
    run of a few new bands over the built-in table (gpu_gemm_tune --over-h200). A new band covers the rows above the
    band top before it in `bands` (the tuner's band tops; without them, before it among base's and over's tops) up to
    its own top; every other row count keeps base's launch, so a band tuned at 130 rows does not move 33-128 rows
    onto its shape."""
    out = {}
    for key in base.keys() | over.keys():
        new = dict(over.get(key, ()))
        old = base.get(key, ())
        edges = set(new) | {r for r, _ in old}
        ladder = sorted(set(bands) or edges)
        lower = {b: max((t for t in ladder if t < b), default=0) for b in new}
        rows = sorted(edges | {lo for lo in lower.values() if lo > 0})

        def launch_at(m: int) -> GemmConfig | None:
            hit = [b for b in new if lower[b] < m <= b]
            return new[min(hit)] if hit else lookup({key: old}, m, *key)

        out[key] = tuple((r, launch_at(r)) for r in rows)
    return out


def cublas_only(M: int, N: int, K: int, dtype: torch.dtype, device, swiglu: bool = False) -> None:
    """The GEMM policy (`config`'s signature) that leaves every weight GEMM to cuBLAS."""
    return None


def lookup(table: Table, M: int, N: int, K: int, swiglu: bool) -> GemmConfig | None:
    """The launch shape of the band of `table` holding M rows for this projection, or None (cuBLAS)."""
    for max_rows, launch in table.get((N, K, swiglu), ()):
        if M <= max_rows:
            return launch
    return None


def config(M: int, N: int, K: int, dtype: torch.dtype, device, swiglu: bool = False) -> GemmConfig | None:
    """The tuned launch shape for an [M, K] x [N, K]^T GEMM on `device`, or None (cuBLAS): the table
    TABLE_ENV names if set, else the device's built-in table (`builtin_table`); bf16/fp16 and M <= GEMM_MAX_ROWS only."""
    if dtype not in (torch.bfloat16, torch.float16) or M > GEMM_MAX_ROWS or triton is None:
        return None
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    table = _env_table()
    if table is None:
        table = builtin_table(str(dev))
        if table is None:
            return None
    return lookup(table, M, N, K, swiglu)


def table_name(device) -> str:
    """Which table `config` reads for bf16 / fp16 GEMMs on `device`, as results record it: "DDTREE_GEMM_TABLE=<path>",
    "H100_TABLE", "H200_TABLE", or "none" (every weight GEMM on cuBLAS on CUDA, on PyTorch's own matmul elsewhere)."""
    dev = torch.device(device)
    if dev.type != "cuda" or triton is None:
        return "none"
    if os.environ.get(TABLE_ENV):
        return f"{TABLE_ENV}={os.environ[TABLE_ENV]}"
    table = builtin_table(str(dev))
    return "H100_TABLE" if table is H100_TABLE else "H200_TABLE" if table is H200_TABLE else "none"


@lru_cache(maxsize=None)
def builtin_table(device: str) -> Table | None:
    """The built-in table of a CUDA device: H100_TABLE on an H100 SXM (common.is_h100_sxm), H200_TABLE on any other
    sm_90 card (the H200, and H100 variants no table was tuned on), None (cuBLAS) elsewhere."""
    dev = torch.device(device)
    if torch.cuda.get_device_capability(dev) != TUNED_CAPABILITY:
        return None
    return H100_TABLE if is_h100_sxm(dev) else H200_TABLE
