"""How close one verify forward is to the machine's limits: roofline(n) and what a timing achieves.

A target forward over n query tokens must stream every weight once and do ~2 FLOPs per parameter
per token, so it cannot beat
    roofline_ms(n) = 1e3 * max(W / HBM_BYTES_PER_S, 2 * P * n / DENSE_FLOP_PER_S)
with W the weight bytes and P the parameters (tied embeddings once; the whole embedding table counted,
as issue 20 does). The limits are the ones issue 20 measured on an H200 (copy bandwidth ~4.3 TB/s,
dense bf16 ~790 TFLOP/s); on other GPUs the ratio column is against those H200 figures. Achieved
GB/s = W / time, TFLOP/s = 2 P n / time. Beside it, where a GEMM-only time was measured (every weight
GEMM once on cuBLAS, nothing else: perf/bench.gemm_only), vs_gemm = ms / gemm_only_ms: 1 + the share
of everything but the weight GEMMs (issue 35's target: <= 1.15). The verify's attention work, a lower bound:
    attention_flops(n) = 4 * layers * q_heads * head_dim * n * prefix_len
(each query row's q k^T and p v over the committed prefix; the tree's own <= L + 1 keys a row left out), so its
achieved TFLOP/s is attention_flops / the attention kernels' time. Knows nothing of how the time was measured.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

HBM_BYTES_PER_S = 4.3e12      # H200, measured copy bandwidth (issue 20)
DENSE_FLOP_PER_S = 790e12     # H200, dense bf16 GEMM (issue 20)


@dataclass
class RooflineRow:
    tokens: int
    ms: float
    roofline_ms: float
    ratio: float              # ms / roofline_ms
    achieved_gb_s: float
    achieved_tflop_s: float
    gemm_only_ms: float | None = None
    vs_gemm: float | None = None      # ms / gemm_only_ms


def weight_bytes_and_params(model: torch.nn.Module) -> tuple[int, int]:
    """(bytes, count) of a model's parameters; parameters() lists a tied tensor once."""
    ps = list(model.parameters())
    return sum(p.numel() * p.element_size() for p in ps), sum(p.numel() for p in ps)


def linear_bytes_and_params(model: torch.nn.Module) -> tuple[int, int]:
    """(bytes, count) of the weights a forward multiplies: every nn.Linear's (the embedding table only where
    lm_head ties to it), once each - the GEMMs' own roofline (`roofline_ms` of these)."""
    seen: dict[int, torch.Tensor] = {}
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            seen.setdefault(m.weight.data_ptr(), m.weight)
    return sum(w.numel() * w.element_size() for w in seen.values()), sum(w.numel() for w in seen.values())


@dataclass(frozen=True)
class AttentionShape:
    """What attention_flops needs of a target and a verify: its attention layers, query heads, head size, prefix."""
    layers: int
    q_heads: int
    head_dim: int
    prefix_len: int

    def flops(self, tokens: int) -> float:
        """attention_flops(n) of the module docstring."""
        return 4.0 * self.layers * self.q_heads * self.head_dim * tokens * self.prefix_len


def roofline_ms(weight_bytes: int, params: int, tokens: int) -> float:
    return 1e3 * max(weight_bytes / HBM_BYTES_PER_S, 2.0 * params * tokens / DENSE_FLOP_PER_S)


def roofline_rows(curve_ms: dict[int, float], weight_bytes: int, params: int,
                  gemm_only_ms: dict[int, float] | None = None) -> list[dict]:
    """One RooflineRow (as a dict) per measured n of a verify curve, in n order (with the GEMM-only time where
    gemm_only_ms has that n)."""
    rows = []
    for n in sorted(curve_ms):
        ms = curve_ms[n]
        roof = roofline_ms(weight_bytes, params, n)
        g = (gemm_only_ms or {}).get(n)
        rows.append(asdict(RooflineRow(n, ms, roof, ms / roof, weight_bytes / (ms * 1e-3) / 1e9,
                                       2.0 * params * n / (ms * 1e-3) / 1e12, g, ms / g if g else None)))
    return rows
