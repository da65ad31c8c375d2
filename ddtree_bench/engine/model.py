"""The target model: Qwen3 dense and Llama-3.x decoders in plain PyTorch.

Parameter names equal Hugging Face's (`model.layers.3.self_attn.q_proj.weight`, `lm_head.weight`),
so a checkpoint's state dict loads as is. `forward` takes token ids, absolute positions and an
attention mask over the KV cache slots, writes the new K/V into the preallocated cache at slots
start .. start+T-1, and returns logits plus the hidden states of requested layers.

Layer i's hidden state is HF's `hidden_states[i + 1]`: the output of decoder layer i, except that
for the last layer HF returns it after the final norm, and so do we.
Knows nothing of drafting, trees or generation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ddtree_bench.engine.cache import KVCache
from ddtree_bench.engine.config import TargetConfig
from ddtree_bench.engine.layers import MLP, RMSNorm, Rotary, apply_rope, attend, causal_mask


class Attention(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.n_heads * d, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(h, self.n_kv * d, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(h, self.n_kv * d, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.n_heads * d, h, bias=cfg.attention_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm

    def project(self, x, cos, sin):
        """x [T, H] -> q [Hq, T, D], k [Hkv, T, D] (q/k-normed where the model has it, then RoPE), v [Hkv, T, D]."""
        T = x.shape[0]
        q = self.q_proj(x).view(T, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(T, self.n_kv, self.head_dim)
        v = self.v_proj(x).view(T, self.n_kv, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q.transpose(0, 1), cos, sin), apply_rope(k.transpose(0, 1), cos, sin), v.transpose(0, 1)

    def forward(self, x, cos, sin, cache: KVCache, layer: int, start: int, mask):
        # x: [T, H]; cos, sin: [T, D]; mask: [T, start + T] bool or None
        q, k, v = self.project(x, cos, sin)
        cache.write(layer, start, k, v)
        keys, values = cache.view(layer, start + x.shape[0])
        return self.o_proj(attend(q, keys, values, mask))


class Block(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, cache, layer, start, mask):
        return self.around(x, lambda h: self.self_attn(h, cos, sin, cache, layer, start, mask))

    def around(self, x, attention):
        """The block around an attention (h -> its output after o_proj): both residuals and the MLP."""
        x = x + attention(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    """HF's `model.*` namespace: embed_tokens, layers, norm."""

    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Target(nn.Module):
    def __init__(self, cfg: TargetConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Decoder(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = Rotary(cfg.rope, cfg.head_dim)

    def new_cache(self, capacity: int) -> KVCache:
        p = self.lm_head.weight
        c = self.cfg
        return KVCache(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, capacity, p.dtype, p.device)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(ids)

    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        start: int,
        mask: torch.Tensor | None = "causal",  # type: ignore[assignment]
        hidden_layers: Sequence[int] = (),
        last_logits_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids, positions: [T]; new K/V go to cache slots start .. start+T-1.

        mask: [T, start + T] bool, None (every slot < start + T visible) or "causal" (default).
        Returns logits [T, V] (or [1, V] with last_logits_only) and, if hidden_layers is given,
        their hidden states concatenated on the feature axis: [T, len(hidden_layers) * H].
        """
        if isinstance(mask, str):
            mask = causal_mask(start, ids.shape[0], ids.device)
        x = self.model.embed_tokens(ids)
        cos, sin = self.rotary(positions, x.dtype)
        x, hidden = self.run_layers(x, lambda i, block, x: block(x, cos, sin, cache, i, start, mask), hidden_layers)
        logits = self.lm_head(x[-1:] if last_logits_only else x)
        return logits, hidden

    def run_layers(self, x, run_block, hidden_layers: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [T, H] through every decoder block (`run_block(i, block, x)` runs block i) and the final norm;
        returns (normed x, the hidden states of `hidden_layers` concatenated on the feature axis, or None).
        Layer i's state is its block's output, the last layer's after the final norm (HF's)."""
        wanted = {l: None for l in hidden_layers}
        last = len(self.model.layers) - 1
        for i, block in enumerate(self.model.layers):
            x = run_block(i, block, x)
            if i in wanted and i != last:
                wanted[i] = x
        x = self.model.norm(x)
        if last in wanted:
            wanted[last] = x
        return x, torch.cat([wanted[l] for l in hidden_layers], dim=-1) if hidden_layers else None
