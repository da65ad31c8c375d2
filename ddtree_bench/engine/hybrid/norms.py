"""The two RMSNorms of the Qwen3.5 / Qwen3-Next family, in Hugging Face's operation order.

* `ZeroCentredRMSNorm`: x / rms(x) * (1 + w), all in fp32, cast back at the end (weights stored as w,
  initialised to 0). Used for the block norms, the final norm and the attention q/k norms.
* `GatedRMSNorm`: per GDN value head, w * (x / rms(x)) cast to x's dtype, times silu(z) in fp32 (w stored
  as is, initialised to 1).
Qwen3-MoE uses the engine's plain `layers.RMSNorm`. Knows nothing of layers or caches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ZeroCentredRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


class GatedRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = self.weight * h.to(dtype)
        return (h * F.silu(z.float())).to(dtype)
