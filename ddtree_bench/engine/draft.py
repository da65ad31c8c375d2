"""The z-lab DFlash block-diffusion drafter (checkpoint format of z-lab/Qwen3-8B-DFlash-b16).

Weights: `fc` (Linear n*H -> H, no bias), `hidden_norm`, `layers.*` (Qwen3-style blocks with q/k
norm), `norm`. No embedding or LM head of its own: the caller passes block embeddings made with the
target's `embed_tokens`, and projects the output with the target's `lm_head`.

One call drafts a block [anchor, mask x (block_size-1)]:
* context features = hidden_norm(fc(concat of the target hidden states at target_layer_ids)) for
  the committed positions not yet in the drafter's cache;
* in every layer, context rows go through that layer's k_proj/v_proj (+ k_norm, RoPE at their
  absolute positions) and are cached; block rows give queries, keys and values;
* block queries see every cached context position and the whole block (non-causal) - or, in
  layers marked causal (sliding layers, as z-lab's newer code and vLLM do), keys at positions <=
  the query's, within the sliding window.
The block's own K/V land in cache slots start.. and are simply overwritten by the next call (the
caller's frontier moves to `start`), which is z-lab's `crop(start)`.

`DFlashDrafter.variant` (None = z-lab's drafter) is a `draft_variants.DraftVariant`: a documented
way an engine can deviate (forced causality, a context window, another sliding window, shifted
block positions, context keys normed with another layer's k_norm, no hidden_norm). The hooks
below read it; the proposer-side deviations (layer ids, mask token, draft length, bonus feeding)
live in `draft_variants.VariantProposer`.
"""

from __future__ import annotations

import torch
from torch import nn

from ddtree_bench.engine.cache import KVCache
from ddtree_bench.engine.config import DraftConfig
from ddtree_bench.engine.layers import MLP, RMSNorm, Rotary, apply_rope, attend


class DraftAttention(nn.Module):
    def __init__(self, cfg: DraftConfig, layer: int):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.n_heads * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(h, self.n_kv * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(h, self.n_kv * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.n_heads * d, h, bias=cfg.attention_bias)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def kv(self, x, cos, sin, k_norm=None):
        T = x.shape[0]
        k = (k_norm or self.k_norm)(self.k_proj(x).view(T, self.n_kv, self.head_dim))
        v = self.v_proj(x).view(T, self.n_kv, self.head_dim)
        return apply_rope(k.transpose(0, 1), cos, sin), v.transpose(0, 1)

    def forward(self, x, ctx, cos, sin, cache: KVCache, layer: int, ctx_start: int, start: int, mask, ctx_k_norm=None):
        # x: [Tb, H] block rows (normed); ctx: [C, H] new context features; cos/sin: [C + Tb, D]
        C, Tb = ctx.shape[0], x.shape[0]
        if C:
            k_ctx, v_ctx = self.kv(ctx, cos[:C], sin[:C], ctx_k_norm)
            cache.write(layer, ctx_start, k_ctx, v_ctx)
        k_blk, v_blk = self.kv(x, cos[C:], sin[C:])
        cache.write(layer, start, k_blk, v_blk)
        q = self.q_norm(self.q_proj(x).view(Tb, self.n_heads, self.head_dim))
        q = apply_rope(q.transpose(0, 1), cos[C:], sin[C:])
        keys, values = cache.view(layer, start + Tb)
        return self.o_proj(attend(q, keys, values, mask))


class DraftBlock(nn.Module):
    def __init__(self, cfg: DraftConfig, layer: int):
        super().__init__()
        self.self_attn = DraftAttention(cfg, layer)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, ctx, cos, sin, cache, layer, ctx_start, start, mask, ctx_k_norm=None):
        x = x + self.self_attn(self.input_layernorm(x), ctx, cos, sin, cache, layer, ctx_start, start, mask, ctx_k_norm)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DraftBlock(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(cfg.rope, cfg.head_dim)
        self.variant = None  # a draft_variants.DraftVariant; None = z-lab's drafter

    @property
    def block_size(self) -> int:
        return self.cfg.block_size

    @property
    def mask_token_id(self) -> int:
        return self.cfg.mask_token_id

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        return self.cfg.target_layer_ids

    def new_cache(self, capacity: int) -> KVCache:
        p = self.fc.weight
        c = self.cfg
        return KVCache(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, capacity, p.dtype, p.device)

    def layer_mask(self, layer: int, start: int, Tb: int, device) -> torch.Tensor | None:
        """[Tb, start + Tb] bool for causal / sliding layers; None (all visible) for full non-causal layers."""
        causal, window = self.cfg.layer_causal[layer], self.cfg.layer_window[layer]
        v = self.variant
        if v is not None:
            causal, window = v.layer_attention(causal, window)
        ctx_window = v.context_window if v is not None else None
        if not causal and window is None and ctx_window is None:
            return None
        q = torch.arange(start, start + Tb, device=device)[:, None]
        k = torch.arange(start + Tb, device=device)[None, :]
        ok = torch.ones(Tb, start + Tb, dtype=torch.bool, device=device)
        if causal:
            ok &= k <= q
        if window is not None:
            ok &= (q - k) < window
            if not causal:
                ok &= (k - q) < window
        if ctx_window is not None:  # context positions older than start - ctx_window are hidden
            ok &= k >= start - ctx_window
        return ok

    def forward(self, target_hidden: torch.Tensor, block_emb: torch.Tensor, cache: KVCache, ctx_start: int, start: int) -> torch.Tensor:
        """target_hidden: [C, n*H] for positions ctx_start .. start-1 (C = start - ctx_start);
        block_emb: [Tb, H] for positions start .. start+Tb-1. Returns normed hidden states [Tb, H]."""
        C, Tb = target_hidden.shape[0], block_emb.shape[0]
        assert ctx_start + C == start, "drafter context must end where the block starts"
        v = self.variant
        ctx = self.fc(target_hidden)
        ctx = self.hidden_norm(ctx) if v is None or v.context_hidden_norm else ctx
        positions = torch.arange(ctx_start, start + Tb, device=block_emb.device)
        if v is not None and v.block_position_offset:
            positions[C:] += v.block_position_offset
        cos, sin = self.rotary(positions, block_emb.dtype)
        knorm = self.layers[v.context_k_norm_layer].self_attn.k_norm if v is not None and v.context_k_norm_layer is not None else None
        x = block_emb
        for i, layer in enumerate(self.layers):
            mask = self.layer_mask(i, start, Tb, x.device)
            x = layer(x, ctx, cos, sin, cache, i, ctx_start, start, mask, knorm)
        return self.norm(x)
