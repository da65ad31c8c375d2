"""Gated DeltaNet (GDN): the recurrent layer of Qwen3.5 / Qwen3-Next, as plain tensor math.

Per token t (per value head; the state S is dk x dv, kept in fp32 while computing):
  u_t   = in_proj_qkv(x_t)                                   the conv input, conv_dim = 2*Hk*dk + Hv*dv
  c_t   = silu(sum_{j<K} w[:, j] * u_{t-K+1+j})               depthwise causal conv over the last K inputs
  q,k,v = split(c_t); q,k L2-normalised (eps 1e-6), q *= dk^-1/2, q/k heads repeated up to Hv
  beta  = sigmoid(in_proj_b(x_t));  g = -exp(A_log) * softplus(in_proj_a(x_t) + dt_bias)   (g <= 0)
  S    <- exp(g) S;  delta = beta (v - S^T k);  S <- S + k (x) delta;  o_t = S^T q
  out_t = out_proj(GatedRMSNorm(o_t, z_t)),  z = in_proj_z(x_t)
Qwen3-Next packs the projections per key head (`in_proj_qkvz`, `in_proj_ba`); `GatedDeltaNet.inputs`
unpacks both layouts into the same (u, z, beta, g).

Two exact forms of the recurrence: `delta_step` (one token for a batch of independent states: the
per-token decode step, the per-node tree step and the replay) and `chunked_delta_rule` (a sequence from
one state, 64 tokens at a time through the triangular (WY) system
  (I + strict(beta K K^T * e^{cum_i - cum_j})) U = beta V - beta e^{cum} K S0,
  o = e^{cum} Q S0 + ((Q K^T * e^{cum_i - cum_j}) masked causal) U,   S_end = e^{cum_end} S0 + sum_j e^{cum_end - cum_j} k_j (x) u_j,
with cum = the running sum of g): the prefill's. They agree to float rounding (tests/engine/hybrid).
Knows nothing of caches, trees or commits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ddtree_bench.engine.hybrid.config import HybridConfig
from ddtree_bench.engine.hybrid.norms import GatedRMSNorm

CHUNK = 64            # tokens per block of the chunked form (transformers' and fla's size)
L2_EPS = 1e-6


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2_EPS)


def conv_windows(buf: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """buf [M, C] conv inputs, index [n, K] rows of buf (oldest first) -> windows [n, C, K]."""
    return buf[index].transpose(1, 2)


def conv_apply(windows: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """windows [n, C, K], weight [C, K] -> silu(sum_j w[:, j] * window[:, j]) [n, C] (in the weight's dtype, then out_dtype)."""
    return F.silu((windows.to(weight.dtype) * weight).sum(-1)).to(out_dtype)


def delta_step(S: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
               beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One gated delta-rule step for n independent states, all fp32.
    S [n, Hv, dk, dv]; q, k [n, Hv, dk]; v [n, Hv, dv]; g, beta [n, Hv] -> (new S, o [n, Hv, dv]);
    q None: no output (a replay needs only the state)."""
    S = S * g.exp()[..., None, None]
    kv = (S * k[..., None]).sum(dim=-2)
    delta = (v - kv) * beta[..., None]
    S = S + k[..., None] * delta[..., None, :]
    return S, None if q is None else (S * q[..., None]).sum(dim=-2)


def chunked_delta_rule(q, k, v, g, beta, S0: torch.Tensor, chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """The same recurrence over a sequence from S0 [Hv, dk, dv]: q, k [T, Hv, dk]; v [T, Hv, dv];
    g, beta [T, Hv] (all fp32) -> (o [T, Hv, dv], S after the last token)."""
    T = q.shape[0]
    outs, S = [], S0
    for s in range(0, T, chunk):
        e = min(T, s + chunk)
        # per head: [Hv, c, .]
        qc, kc, vc = (t[s:e].transpose(0, 1) for t in (q, k, v))
        gc, bc = g[s:e].transpose(0, 1), beta[s:e].transpose(0, 1)
        c = e - s
        cum = gc.cumsum(-1)                                             # [Hv, c]
        causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
        decay = (cum[:, :, None] - cum[:, None, :]).masked_fill(~causal, float("-inf")).exp()   # e^{cum_i - cum_j}, j <= i
        strict = decay.masked_fill(torch.eye(c, dtype=torch.bool, device=q.device), 0.0)
        A = torch.eye(c, device=q.device) + (bc[:, :, None] * (kc @ kc.transpose(-1, -2))) * strict
        rhs = bc[:, :, None] * (vc - cum.exp()[:, :, None] * (kc @ S))
        U = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
        o = cum.exp()[:, :, None] * (qc @ S) + ((qc @ kc.transpose(-1, -2)) * decay) @ U
        last = cum[:, -1:]                                               # [Hv, 1]
        S = last.exp()[:, :, None] * S + (kc * (last - cum).exp()[:, :, None]).transpose(-1, -2) @ U
        outs.append(o.transpose(0, 1))
    return torch.cat(outs), S


class GatedDeltaNet(nn.Module):
    """The parameters of one GDN layer under Hugging Face's names, and the per-token maps around the
    recurrence (the recurrence itself runs in state.py / tree_verify.py over the functions above)."""

    def __init__(self, cfg: HybridConfig):
        super().__init__()
        h = cfg.hidden_size
        self.Hk, self.Hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        self.dk, self.dv, self.K = cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.conv_kernel
        self.key_dim, self.value_dim = self.Hk * self.dk, self.Hv * self.dv
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.packed = cfg.packed_gdn
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.K, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.Hv))
        self.A_log = nn.Parameter(torch.zeros(self.Hv))
        self.norm = GatedRMSNorm(self.dv, cfg.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, h, bias=False)
        if self.packed:
            self.in_proj_qkvz = nn.Linear(h, 2 * self.key_dim + 2 * self.value_dim, bias=False)
            self.in_proj_ba = nn.Linear(h, 2 * self.Hv, bias=False)
        else:
            self.in_proj_qkv = nn.Linear(h, self.conv_dim, bias=False)
            self.in_proj_z = nn.Linear(h, self.value_dim, bias=False)
            self.in_proj_b = nn.Linear(h, self.Hv, bias=False)
            self.in_proj_a = nn.Linear(h, self.Hv, bias=False)

    def inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [T, H] -> u [T, conv_dim] (conv input), z [T, Hv, dv], beta [T, Hv], g [T, Hv] (fp32)."""
        T = x.shape[0]
        if self.packed:   # per key head: [q dk | k dk | v r*dv | z r*dv] and [b r | a r], r = Hv / Hk
            r = self.Hv // self.Hk
            qkvz = self.in_proj_qkvz(x).view(T, self.Hk, 2 * self.dk + 2 * r * self.dv)
            q, k, v, z = torch.split(qkvz, [self.dk, self.dk, r * self.dv, r * self.dv], dim=-1)
            b, a = torch.split(self.in_proj_ba(x).view(T, self.Hk, 2 * r), [r, r], dim=-1)
            u = torch.cat([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], dim=-1)
            z, b, a = z.reshape(T, self.Hv, self.dv), b.reshape(T, self.Hv), a.reshape(T, self.Hv)
        else:
            u = self.in_proj_qkv(x)
            z = self.in_proj_z(x).view(T, self.Hv, self.dv)
            b, a = self.in_proj_b(x), self.in_proj_a(x)
        beta = b.sigmoid().float()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        return u, z, beta, g.float()

    def conv_weight(self) -> torch.Tensor:
        return self.conv1d.weight.squeeze(1)     # [C, K]

    def qkv(self, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Conv outputs c [n, conv_dim] -> q, k [n, Hv, dk] (L2-normed, q scaled, heads repeated) and v [n, Hv, dv], fp32."""
        n = c.shape[0]
        q, k, v = torch.split(c, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = l2norm(q.reshape(n, self.Hk, self.dk).float()) * self.dk ** -0.5
        k = l2norm(k.reshape(n, self.Hk, self.dk).float())
        if self.Hv != self.Hk:
            q = q.repeat_interleave(self.Hv // self.Hk, dim=1)
            k = k.repeat_interleave(self.Hv // self.Hk, dim=1)
        return q, k, v.reshape(n, self.Hv, self.dv).float()

    def output(self, o: torch.Tensor, z: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """o [n, Hv, dv] (fp32), z [n, Hv, dv] -> out_proj(GatedRMSNorm(o, z)) [n, H]."""
        y = self.norm(o.to(dtype), z)
        return self.out_proj(y.reshape(o.shape[0], -1))
