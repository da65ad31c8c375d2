"""The full-attention layer of hybrid targets (and of Qwen3-MoE) over the engine's KV cache.

Gated attention (Qwen3.5, Qwen3-Next): `q_proj` gives, per head, a query and an output gate of head_dim
each; q and k are RMS-normed per head ((1 + w) norms), the first `rotary_dim` dims rotated (partial RoPE),
and the attention output is multiplied by sigmoid(gate) before `o_proj`. Qwen3-MoE: no gate, plain q/k
RMSNorm, full rotary. Text-only mRoPE equals plain RoPE (all three position rows are equal).

`project` works over any rows (several requests' tokens at once); the attention itself is per request
(`layers.attend` with that request's mask over its own cache). Knows nothing of trees or GDN.
"""

from __future__ import annotations

import torch
from torch import nn

from ddtree_bench.engine.hybrid.config import HybridConfig
from ddtree_bench.engine.hybrid.norms import ZeroCentredRMSNorm
from ddtree_bench.engine.layers import RMSNorm, rotate_half


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [H, T, D]; cos, sin [T, R] with R <= D: rotate the first R dims, pass the rest through."""
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    return torch.cat([rot * cos + rotate_half(rot) * sin, rest], dim=-1)


class HybridAttention(nn.Module):
    def __init__(self, cfg: HybridConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim, self.gated = cfg.num_attention_heads, cfg.num_key_value_heads, d, cfg.gated_attention
        self.q_proj = nn.Linear(h, self.n_heads * d * (2 if self.gated else 1), bias=False)
        self.k_proj = nn.Linear(h, self.n_kv * d, bias=False)
        self.v_proj = nn.Linear(h, self.n_kv * d, bias=False)
        self.o_proj = nn.Linear(self.n_heads * d, h, bias=False)
        norm = ZeroCentredRMSNorm if cfg.zero_centred_norms else RMSNorm
        self.q_norm = norm(d, cfg.rms_norm_eps)
        self.k_norm = norm(d, cfg.rms_norm_eps)

    def project(self, x, cos, sin):
        """x [T, H] -> q [Hq, T, D], k [Hkv, T, D], v [Hkv, T, D], gate [T, Hq*D] or None."""
        T, d = x.shape[0], self.head_dim
        gate = None
        if self.gated:
            q, gate = torch.chunk(self.q_proj(x).view(T, self.n_heads, 2 * d), 2, dim=-1)
            gate = gate.reshape(T, -1)
        else:
            q = self.q_proj(x).view(T, self.n_heads, d)
        q = self.q_norm(q)
        k = self.k_norm(self.k_proj(x).view(T, self.n_kv, d))
        v = self.v_proj(x).view(T, self.n_kv, d)
        return (apply_partial_rope(q.transpose(0, 1), cos, sin), apply_partial_rope(k.transpose(0, 1), cos, sin),
                v.transpose(0, 1), gate)

    def output(self, attn: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        """attn [T, Hq*D] (the attention result) -> o_proj(attn * sigmoid(gate))."""
        return self.o_proj(attn * torch.sigmoid(gate) if gate is not None else attn)
