"""Static-shape forwards of the target and the DFlash drafter, for CUDA-graph capture.

The plain forwards (model.py, draft.py) slice the KV cache to the live frontier with Python ints,
so every round has new shapes. Here every shape depends only on the number of query tokens:
* the frontier `start` is a 0-d device tensor; new K/V go to slots start + arange(T) with
  `index_copy_` (`StaticKV.write`);
* attention always spans the whole preallocated cache, and an additive bias [T, capacity]
  (0 = visible, -inf = hidden) hides the slots past the frontier, as gpt-fast does;
* grouped-query attention folds the query-head group into the query axis ([Hkv, g*T, D] against
  K/V [Hkv, S, D]), so SDPA sees plain multi-head attention with a mask and can use any fused
  kernel (the memory-efficient one refuses `enable_gqa=True`); on an H200 with torch 2.11 this ran
  1.3-1.4x faster than the plain `attend` (docs/gpu-performance.md). The bias comes already
  repeated g times.

The weights are the modules' own (`target.model.layers[i].self_attn.q_proj`, ...); only the
attention plumbing differs, so logits equal the plain forwards up to floating-point reduction order
(tests/test_fastpath.py). Knows nothing of trees, rounds or graphs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ddtree_bench.engine.cache import KVCache
from ddtree_bench.engine.layers import apply_rope

NEG_INF = float("-inf")


class StaticKV:
    """A KVCache seen with static shapes: `write` scatters to start + arange(T) (start: 0-d device
    tensor), `view` returns every slot. Duck-types the two methods the attention layers call."""

    def __init__(self, cache: KVCache):
        self.cache = cache

    @property
    def capacity(self) -> int:
        return self.cache.capacity

    def write(self, layer: int, start: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [kv_heads, T, head_dim] -> slots start .. start+T-1."""
        slots = start + torch.arange(k.shape[1], device=k.device)
        self.cache.k[layer].index_copy_(1, slots, k)
        self.cache.v[layer].index_copy_(1, slots, v)

    def view(self, layer: int, end=None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.k[layer], self.cache.v[layer]


def visible_bias(visible: torch.Tensor, dtype: torch.dtype, group: int) -> torch.Tensor:
    """[T, S] bool -> additive [group*T, S] bias in `dtype` (0 visible, -inf hidden), rows repeated per group."""
    bias = torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, NEG_INF)
    return bias.repeat(group, 1) if group > 1 else bias


def grouped_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """q: [Hq, T, D]; k, v: [Hkv, S, D]; bias: [g*T, S] with g = Hq // Hkv. Returns [T, Hq*D].

    Query head h uses KV head h // g (HF's repeat_kv), so q.view(Hkv, g, T, D) lines the group up
    with its KV head; folding (g, T) into one query axis makes it plain multi-head attention."""
    Hq, T, D = q.shape
    Hkv = k.shape[0]
    g = Hq // Hkv
    out = F.scaled_dot_product_attention(q.reshape(Hkv, g * T, D)[None], k[None], v[None], attn_mask=bias[None, None])[0]
    return out.reshape(Hq, T, D).transpose(0, 1).reshape(T, Hq * D)


def _attention(attn, x, cos, sin, kv: StaticKV, layer: int, start, bias, ctx=None, ctx_cos=None, ctx_sin=None, ctx_start=None):
    """One attention layer of the target (ctx None) or the drafter (ctx = context features to cache first)."""
    T = x.shape[0]
    qk_norm = getattr(attn, "qk_norm", True)  # the drafter's attention always has q/k norms
    if ctx is not None and ctx.shape[0]:
        C = ctx.shape[0]
        kc = attn.k_proj(ctx).view(C, attn.n_kv, attn.head_dim)
        vc = attn.v_proj(ctx).view(C, attn.n_kv, attn.head_dim)
        kc = apply_rope(attn.k_norm(kc).transpose(0, 1), ctx_cos, ctx_sin)
        kv.write(layer, ctx_start, kc, vc.transpose(0, 1))
    q = attn.q_proj(x).view(T, attn.n_heads, attn.head_dim)
    k = attn.k_proj(x).view(T, attn.n_kv, attn.head_dim)
    v = attn.v_proj(x).view(T, attn.n_kv, attn.head_dim)
    if qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q = apply_rope(q.transpose(0, 1), cos, sin)
    k = apply_rope(k.transpose(0, 1), cos, sin)
    kv.write(layer, start, k, v.transpose(0, 1))
    keys, values = kv.view(layer)
    return attn.o_proj(grouped_attend(q, keys, values, bias))


def group_size(module) -> int:
    """Query heads per KV head of a target or drafter."""
    attn = module.model.layers[0].self_attn if hasattr(module, "model") else module.layers[0].self_attn
    return attn.n_heads // attn.n_kv


def target_forward(target, ids: torch.Tensor, positions: torch.Tensor, kv: StaticKV, start: torch.Tensor,
                   bias: torch.Tensor, hidden_layers: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Same contract as Target.forward with a static cache: logits [T, V] and the hidden states of
    `hidden_layers` concatenated [T, n*H] (the last layer's after the final norm, as HF returns it)."""
    x = target.model.embed_tokens(ids)
    cos, sin = target.rotary(positions, x.dtype)
    wanted = {l: None for l in hidden_layers}
    last = len(target.model.layers) - 1
    for i, block in enumerate(target.model.layers):
        x = x + _attention(block.self_attn, block.input_layernorm(x), cos, sin, kv, i, start, bias)
        x = x + block.mlp(block.post_attention_layernorm(x))
        if i in wanted and i != last:
            wanted[i] = x
    x = target.model.norm(x)
    if last in wanted:
        wanted[last] = x
    hidden = torch.cat([wanted[l] for l in hidden_layers], dim=-1) if hidden_layers else None
    return target.lm_head(x), hidden


def draft_visible(drafter, layer: int, start: torch.Tensor, Tb: int, capacity: int) -> torch.Tensor:
    """[Tb, capacity] bool visibility of the block rows at start.. in drafter layer `layer`:
    slots < start + Tb (the context plus the whole block), narrowed for causal / sliding layers."""
    dev = start.device
    q = start + torch.arange(Tb, device=dev)[:, None]
    k = torch.arange(capacity, device=dev)[None, :]
    ok = k < start + Tb
    if drafter.cfg.layer_causal[layer]:
        ok = ok & (k <= q)
    window = drafter.cfg.layer_window[layer]
    if window is not None:
        ok = ok & ((q - k) < window)
        if not drafter.cfg.layer_causal[layer]:
            ok = ok & ((k - q) < window)
    return ok.expand(Tb, capacity)


def draft_forward(drafter, target_hidden: torch.Tensor, block_emb: torch.Tensor, kv: StaticKV,
                  ctx_start: torch.Tensor, start: torch.Tensor, biases: Sequence[torch.Tensor]) -> torch.Tensor:
    """Same contract as DFlashDrafter.forward with a static cache. target_hidden: [C, n*H] for
    positions ctx_start..; block_emb: [Tb, H] for positions start..; biases: one [g*Tb, S] per layer.

    C may exceed start - ctx_start (padding): the extra context rows land in slots start.. and the
    block's own K/V, written after them in every layer, overwrite them before anything reads them."""
    C, Tb = target_hidden.shape[0], block_emb.shape[0]
    dev = block_emb.device
    ctx = drafter.hidden_norm(drafter.fc(target_hidden))
    positions = torch.cat([ctx_start + torch.arange(C, device=dev), start + torch.arange(Tb, device=dev)])
    cos, sin = drafter.rotary(positions, block_emb.dtype)
    x = block_emb
    for i, layer in enumerate(drafter.layers):
        h = layer.input_layernorm(x)
        x = x + _attention(layer.self_attn, h, cos[C:], sin[C:], kv, i, start, biases[i],
                           ctx=ctx, ctx_cos=cos[:C], ctx_sin=sin[:C], ctx_start=ctx_start)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return drafter.norm(x)
