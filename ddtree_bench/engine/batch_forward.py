"""The target's and the drafter's forward over several requests at once (the batched plain loop's).

Each request brings its own tokens, absolute positions, KV cache (its own region: a `KVCache` of
its own), cache frontier `start` and attention mask. The forward runs every weight once over the
*concatenation* of all requests' tokens (one GEMM per projection and layer: where batching pays,
the weights are read once per round instead of once per request), and runs attention per request
over that request's own cache with that request's own mask - the call batch 1 makes, with the same
shapes - so a request's nodes see only its own committed prefix and its own ancestors, and no
padding or cross-request mask is needed (varlen attention, as flash-attn's varlen kernels do it).

Numerics: row-wise ops (norms, RoPE, SwiGLU) and the attention calls are identical to batch 1;
only the GEMMs see more rows, which in fp32 may change the last bits of a row (BLAS blocking), so
batched and batch-1 outputs are equal token for token (tests/engine/test_batch.py), not
necessarily bit for bit.

Mirrors `model.Target.forward` and `draft.DFlashDrafter.forward` (including the drafter's
`variant` hooks); knows nothing of trees, sampling or scheduling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ddtree_bench.engine.cache import KVCache
from ddtree_bench.engine.draft import DFlashDrafter
from ddtree_bench.engine.layers import apply_rope, attend
from ddtree_bench.engine.model import Target


@dataclass
class TargetRow:
    """One request's part of a batched target forward: ids/positions [T], new K/V to cache slots
    start .. start+T-1, mask [T, start+T] bool or None (every slot < start+T visible)."""

    ids: torch.Tensor
    positions: torch.Tensor
    cache: KVCache
    start: int
    mask: torch.Tensor | None


def _splits(lengths: Sequence[int]) -> list[tuple[int, int]]:
    out, at = [], 0
    for n in lengths:
        out.append((at, at + n))
        at += n
    return out


def target_forward_batch(target: Target, rows: Sequence[TargetRow], hidden_layers: Sequence[int] = ()
                         ) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Per request (logits [T_i, V], hidden [T_i, len(hidden_layers) * H] or None), as
    `Target.forward(ids, positions, cache, start, mask, hidden_layers)` would give for each alone."""
    if hasattr(target, "forward_rows"):   # hybrid targets (engine/hybrid/model.py) batch their own way
        return target.forward_rows(rows, hidden_layers)
    spans = _splits([int(r.ids.shape[0]) for r in rows])
    ids = torch.cat([r.ids for r in rows])
    positions = torch.cat([r.positions for r in rows])
    x = target.model.embed_tokens(ids)
    cos, sin = target.rotary(positions, x.dtype)

    def run_block(i, block, x):
        a = block.self_attn

        def attention(h):  # the projections over every request at once, attention per request
            q, k, v = a.project(h, cos, sin)
            outs = []
            for r, (s, e) in zip(rows, spans):
                r.cache.write(i, r.start, k[:, s:e], v[:, s:e])
                keys, values = r.cache.view(i, r.start + (e - s))
                outs.append(attend(q[:, s:e], keys, values, r.mask))
            return a.o_proj(torch.cat(outs))

        return block.around(x, attention)

    x, hidden = target.run_layers(x, run_block, hidden_layers)
    logits = target.lm_head(x)
    return [(logits[s:e], hidden[s:e] if hidden is not None else None) for s, e in spans]


@dataclass
class DraftRow:
    """One request's part of a batched draft: the new context features [C, n*H] of positions
    draft_len .. start-1, the block's token ids [Tb] (bonus, masks) at positions start.., and the
    request's drafter cache."""

    ctx: torch.Tensor
    block: torch.Tensor
    cache: KVCache
    draft_len: int
    start: int


def drafter_forward_batch(drafter: DFlashDrafter, embed, rows: Sequence[DraftRow]) -> list[torch.Tensor]:
    """Per request the drafter's normed block hidden states [Tb, H], as `DFlashDrafter.forward`
    gives for each alone (`embed` = the target's embed_tokens)."""
    v = drafter.variant
    Cs = [int(r.ctx.shape[0]) for r in rows]
    Tbs = [int(r.block.shape[0]) for r in rows]
    for r, C in zip(rows, Cs):
        assert r.draft_len + C == r.start, "drafter context must end where the block starts"
    cspans, bspans = _splits(Cs), _splits(Tbs)
    ctx = drafter.fc(torch.cat([r.ctx for r in rows]))
    ctx = drafter.hidden_norm(ctx) if v is None or v.context_hidden_norm else ctx
    x = embed(torch.cat([r.block for r in rows]))
    dev = x.device
    cpos, bpos = [], []
    for r, C, Tb in zip(rows, Cs, Tbs):
        cpos.append(torch.arange(r.draft_len, r.start, device=dev))
        p = torch.arange(r.start, r.start + Tb, device=dev)
        if v is not None and v.block_position_offset:
            p = p + v.block_position_offset
        bpos.append(p)
    ccos, csin = drafter.rotary(torch.cat(cpos), x.dtype)
    bcos, bsin = drafter.rotary(torch.cat(bpos), x.dtype)
    knorm = drafter.layers[v.context_k_norm_layer].self_attn.k_norm if v is not None and v.context_k_norm_layer is not None else None
    for i, layer in enumerate(drafter.layers):
        a = layer.self_attn
        h = layer.input_layernorm(x)
        k_ctx = v_ctx = None
        if ctx.shape[0]:
            k_ctx, v_ctx = a.kv(ctx, ccos, csin, knorm)
        k_blk, v_blk = a.kv(h, bcos, bsin)
        Tall = h.shape[0]
        q = a.q_norm(a.q_proj(h).view(Tall, a.n_heads, a.head_dim))
        q = apply_rope(q.transpose(0, 1), bcos, bsin)
        outs = []
        for r, (cs, ce), (bs, be) in zip(rows, cspans, bspans):
            if ce > cs:
                r.cache.write(i, r.draft_len, k_ctx[:, cs:ce], v_ctx[:, cs:ce])
            r.cache.write(i, r.start, k_blk[:, bs:be], v_blk[:, bs:be])
            keys, values = r.cache.view(i, r.start + (be - bs))
            mask = drafter.layer_mask(i, r.start, be - bs, dev)
            outs.append(attend(q[:, bs:be], keys, values, mask))
        x = x + a.o_proj(torch.cat(outs))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    x = drafter.norm(x)
    return [x[s:e] for s, e in bspans]
