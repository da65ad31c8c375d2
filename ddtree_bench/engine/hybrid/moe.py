"""The routed mixture-of-experts MLP of Qwen3-MoE, Qwen3-Next and Qwen3.5-MoE.

Router: logits = W_r x; p = softmax(logits) in fp32; the top_k experts by p, renormalised to sum 1 when
`norm_topk_prob`, cast back to the logits' dtype. Output = sum over the chosen experts e of
p_e * down_e(silu(gate_e(x)) * up_e(x)), plus, where the model has one, sigmoid(w_s . x) * shared(x).
Experts are stored per expert (`experts.{e}.gate_proj.weight`, the checkpoints' layout); loading.py turns a
fused `experts.gate_up_proj` / `experts.down_proj` pair into it. Every token is routed on its own, so a
tree node's MLP output does not depend on the other nodes. Knows nothing of attention or caches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ddtree_bench.engine.hybrid.config import MoEConfig
from ddtree_bench.engine.layers import MLP


class SparseMoE(nn.Module):
    def __init__(self, hidden: int, moe: MoEConfig):
        super().__init__()
        self.cfg = moe
        self.gate = nn.Linear(hidden, moe.num_experts, bias=False)
        self.experts = nn.ModuleList(MLP(hidden, moe.intermediate_size) for _ in range(moe.num_experts))
        if moe.shared_intermediate_size:
            self.shared_expert = MLP(hidden, moe.shared_intermediate_size)
            self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] -> (weights [T, k] in x's dtype, expert ids [T, k])."""
        logits = self.gate(x)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        top, ids = torch.topk(probs, self.cfg.top_k, dim=-1)
        if self.cfg.norm_topk_prob:
            top = top / top.sum(dim=-1, keepdim=True)
        return top.to(logits.dtype), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        out = torch.zeros_like(x)
        for e in torch.unique(ids).tolist():
            tok, slot = torch.where(ids == e)
            y = self.experts[e](x[tok]) * weights[tok, slot, None]
            out.index_add_(0, tok, y.to(out.dtype))
        if self.cfg.shared_intermediate_size:
            out = out + F.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out
