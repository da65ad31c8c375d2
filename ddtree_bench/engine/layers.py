"""Building blocks shared by the target and the drafter: RMSNorm, rotary embeddings, the SwiGLU MLP
and masked attention over a preallocated KV cache.

Numerics follow Hugging Face's Qwen3/Llama code (fp32 RMSNorm statistics, fp32 RoPE tables cast to
the activation dtype) so that logits agree with transformers to ~1e-6 in fp32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ddtree_bench.engine.config import RopeConfig


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x / rms(x) over the last axis; statistics in fp32, the product in x's dtype (HF's order)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class MLP(nn.Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, inter: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=bias)
        self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Inverse frequencies [head_dim/2] in fp32, with linear or llama3 scaling applied."""
    inv = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.kind == "linear":
        inv = inv / rope.factor
    elif rope.kind == "llama3":
        low_wavelen = rope.original_max_position_embeddings / rope.low_freq_factor
        high_wavelen = rope.original_max_position_embeddings / rope.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / rope.factor, inv)
        smooth = (rope.original_max_position_embeddings / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor
        )
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv = torch.where(medium, smoothed, scaled)
    return inv


class Rotary(nn.Module):
    """cos/sin tables for arbitrary absolute positions: positions [T] -> cos, sin [T, head_dim]."""

    def __init__(self, rope: RopeConfig, head_dim: int):
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(rope, head_dim), persistent=False)

    def _apply(self, fn, *args, **kwargs):
        # Keep inv_freq in fp32 through module.to(bfloat16/float16), as HF's from_pretrained does:
        # rounded to bf16 it shifts the angle at distance d by up to d * 2^-9 * freq radians.
        inv = self.inv_freq
        super()._apply(fn, *args, **kwargs)
        self.inv_freq = inv.to(device=self.inv_freq.device, dtype=torch.float32)
        return self

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]  # [T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [H, T, D]; cos, sin: [T, D]."""
    return x * cos + rotate_half(x) * sin


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Scaled dot-product attention with grouped KV heads.

    q: [Hq, T, D]; k, v: [Hkv, S, D]; mask: [T, S] bool (True = may attend) or None (all visible).
    Returns [T, Hq * D].
    """
    out = F.scaled_dot_product_attention(
        q[None], k[None], v[None], attn_mask=None if mask is None else mask[None, None], enable_gqa=q.shape[0] != k.shape[0]
    )[0]
    return out.transpose(0, 1).reshape(q.shape[1], -1)


def causal_mask(start: int, length: int, device: torch.device) -> torch.Tensor:
    """[length, start + length] bool: query i (at slot start + i) sees slots <= start + i."""
    rows = torch.arange(length, device=device)[:, None] + start
    cols = torch.arange(start + length, device=device)[None, :]
    return cols <= rows
