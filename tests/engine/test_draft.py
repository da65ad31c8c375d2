"""The DFlash drafter against an independent slow twin written here from the description of z-lab's
`Qwen3DFlashAttention` (shared/docs/dflash-drafter.md §1.2-1.4), recomputing every round from
scratch with no cache:

  ctx   = hidden_norm(fc(concat of target hidden states))          for positions 0 .. start-1
  per layer: h = input_layernorm(x)
             q = rope(q_norm(q_proj(h)))                              block rows only
             k = rope(k_norm(k_proj([ctx ; h]))), v = v_proj([ctx ; h])   context rows, then block rows
             attention of the block queries over [context ; block] keys, with the layer's mask:
             full non-causal layers see everything; causal layers see keys at positions <= the
             query's; sliding layers see keys with q - k < window (and k - q < window if non-causal)
             x = x + o_proj(attn); x = x + mlp(post_attention_layernorm(x))
  out   = norm(x)

The engine computes the same thing incrementally: context K/V cached once per position, the block's
K/V overwritten by the next round. Several rounds with irregular advances must agree.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ddtree_bench.engine.config import parse_draft_config, parse_target_config
from ddtree_bench.engine.draft import DFlashDrafter
from ddtree_bench.engine.generate import DFlashProposer
from ddtree_bench.engine.loading import random_configs, random_pair
from engine_support import one_torch_thread  # noqa: F401 (fixture)

# ---------------------------------------------------------------------------- the twin


def _rms(x, w, eps):
    x32 = x.float()
    return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rope(x, positions, theta):
    """x: [T, heads, D] at absolute positions [T]; default (unscaled) RoPE, rotate-half layout."""
    D = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, D, 2).float() / D))
    ang = positions.float()[:, None] * inv[None, :]
    cos, sin = torch.cat([ang, ang], -1).cos()[:, None, :], torch.cat([ang, ang], -1).sin()[:, None, :]
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def twin_draft(drafter: DFlashDrafter, feats: torch.Tensor, block_emb: torch.Tensor, start: int, theta: float) -> torch.Tensor:
    """feats: target hidden states [start, n*H] of every committed position; block_emb [Tb, H]."""
    p = {k: v.detach() for k, v in drafter.named_parameters()}
    c = drafter.cfg
    eps, Hq, Hkv, D = c.rms_norm_eps, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    Tb = block_emb.shape[0]
    ctx = _rms(feats @ p["fc.weight"].T, p["hidden_norm.weight"], eps)
    qpos = torch.arange(start, start + Tb)
    kpos = torch.arange(start + Tb)
    x = block_emb
    for i in range(c.num_hidden_layers):
        w = lambda name: p[f"layers.{i}.{name}"]  # noqa: E731
        h = _rms(x, w("input_layernorm.weight"), eps)
        q = _rope(_rms((h @ w("self_attn.q_proj.weight").T).view(Tb, Hq, D), w("self_attn.q_norm.weight"), eps), qpos, theta)
        kv_in = torch.cat([ctx, h])
        k = _rope(_rms((kv_in @ w("self_attn.k_proj.weight").T).view(-1, Hkv, D), w("self_attn.k_norm.weight"), eps), kpos, theta)
        v = (kv_in @ w("self_attn.v_proj.weight").T).view(-1, Hkv, D)
        rep = Hq // Hkv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(D)
        allowed = torch.ones(Tb, start + Tb, dtype=torch.bool)
        dq, dk = qpos[:, None], kpos[None, :]
        if c.layer_causal[i]:
            allowed &= dk <= dq
        if c.layer_window[i] is not None:
            allowed &= (dq - dk) < c.layer_window[i]
            if not c.layer_causal[i]:
                allowed &= (dk - dq) < c.layer_window[i]
        scores = scores.masked_fill(~allowed[None], float("-inf"))
        attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(Tb, Hq * D)
        x = x + attn @ w("self_attn.o_proj.weight").T
        h2 = _rms(x, w("post_attention_layernorm.weight"), eps)
        x = x + (F.silu(h2 @ w("mlp.gate_proj.weight").T) * (h2 @ w("mlp.up_proj.weight").T)) @ w("mlp.down_proj.weight").T
    return _rms(x, p["norm.weight"], eps)


# ---------------------------------------------------------------------------- cases

LAYOUTS = {
    "full-noncausal": {},
    "sliding-causal": {"layer_types": ["sliding_attention", "full_attention", "sliding_attention"], "sliding_window": 5},
    "sliding-noncausal": {"layer_types": ["sliding_attention", "full_attention", "sliding_attention"], "sliding_window": 5,
                          "is_causal": False},
    "all-causal": {"is_causal": True},
}
EXPECT = {  # (layer_causal, layer_window) the config must parse into
    "full-noncausal": ((False,) * 3, (None,) * 3),
    "sliding-causal": ((True, False, True), (5, None, 5)),
    "sliding-noncausal": ((False, False, False), (5, None, 5)),
    "all-causal": ((True,) * 3, (None,) * 3),
}


def make_drafter(layout: str, block_size: int, seed: int = 0) -> DFlashDrafter:
    tcfg, dcfg = random_configs(draft_layers=3, block_size=block_size)
    dcfg.update(LAYOUTS[layout])
    drafter = DFlashDrafter(parse_draft_config(dcfg, parse_target_config(tcfg)))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, prm in drafter.named_parameters():
            prm.copy_(1.0 + 0.2 * torch.randn(prm.shape, generator=g) if name.endswith("norm.weight")
                      else torch.randn(prm.shape, generator=g) / prm.shape[-1] ** 0.5)
    return drafter.eval()


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("block_size", [8, 16])
def test_incremental_drafting_equals_from_scratch_twin(layout, block_size):
    drafter = make_drafter(layout, block_size)
    assert (drafter.cfg.layer_causal, drafter.cfg.layer_window) == EXPECT[layout]
    g = torch.Generator().manual_seed(block_size)
    nH, H = len(drafter.target_layer_ids) * 64, 64
    feats = torch.randn(80, nH, generator=g) * 2
    cache = drafter.new_cache(80 + block_size)
    draft_len = 0
    # round starts: a prompt of 7, then advances of 1, 16 (a full block), 0 (redraft, no new context), 3, 11
    for start in (7, 8, 8 + block_size, 8 + block_size, 11 + block_size, 22 + block_size):
        block = torch.randn(block_size, H, generator=g)
        with torch.inference_mode():
            got = drafter(feats[draft_len:start], block, cache, draft_len, start)
        want = twin_draft(drafter, feats[:start], block, start, theta=10000.0)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=lambda m: f"round at {start}: {m}")
        draft_len = start


def test_layer_masks_differ_so_the_twin_would_notice():
    """Guard on the test itself: with these settings the masked layers change the output."""
    g = torch.Generator().manual_seed(0)
    feats, block = torch.randn(20, 128, generator=g), torch.randn(8, 64, generator=g)
    outs = {k: twin_draft(make_drafter(k, 8), feats, block, 20, 10000.0) for k in LAYOUTS}
    keys = list(outs)
    for i in range(len(keys)):
        for j in range(i + 1, len(keys)):
            assert not torch.allclose(outs[keys[i]], outs[keys[j]], atol=1e-3), (keys[i], keys[j])


def test_proposer_uses_target_embedding_and_head():
    """DFlashProposer: block [bonus, mask x 15] embedded with the target's table, drafted, and the
    outputs at block positions 1..15 projected by the target's lm_head."""
    target, drafter = random_pair(seed=1)
    prop = DFlashProposer(drafter, target)
    g = torch.Generator().manual_seed(4)
    feats = torch.randn(30, 128, generator=g)
    cache = prop.new_cache(64)
    with torch.inference_mode():
        l1 = prop.propose(feats[:12], 17, cache, 0, 12)
        l2 = prop.propose(feats[12:19], 33, cache, 12, 19)
    for bonus, start, got in ((17, 12, l1), (33, 19, l2)):
        block = torch.full((16,), drafter.mask_token_id)
        block[0] = bonus
        h = twin_draft(drafter, feats[:start], target.model.embed_tokens.weight[block].detach(), start, 10000.0)
        assert got.shape == (15, 64)
        torch.testing.assert_close(got, h[1:] @ target.lm_head.weight.detach().T, atol=1e-5, rtol=1e-5)


class _Recording:
    """Wraps a proposer: records every call's (draft_len, start) and passes it through."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []
        self.block_size, self.target_layer_ids = inner.block_size, inner.target_layer_ids

    def new_cache(self, capacity):
        self.cache = self.inner.new_cache(capacity)
        return self.cache

    def propose(self, ctx, bonus, cache, draft_len, start):
        self.calls.append((draft_len, start))
        return self.inner.propose(ctx, bonus, cache, draft_len, start)


@pytest.mark.parametrize("method,budget", [("dflash", 0), ("ddtree", 24)])
def test_the_drafters_context_cache_equals_a_fresh_forward(method, budget):
    """After a whole generation (irregular accepted lengths, KV compaction of non-prefix paths), the
    drafter's cached context K/V of every committed position equal those of one fresh drafter
    forward over the target's from-scratch hidden states of the committed tokens. A wrong context
    (stale rows, the rejected branch's features, an off-by-one frontier) keeps decoding lossless and
    only lowers tau, so no lossless test can catch it; this one does."""
    from ddtree_bench.engine.generate import Engine
    from engine_support import hidden_reference

    target, drafter = random_pair(seed=5)
    rec = _Recording(DFlashProposer(drafter, target))
    engine = Engine(target, proposer=rec, fast=True)
    prompt = list(range(3, 40))
    g = engine.generate(prompt, method, budget, max_new_tokens=40)
    assert len(rec.calls) == len(g.accept_lengths) >= 3
    S = rec.calls[-1][1]                      # the last draft's block sat at S: slots < S hold context
    seq = (prompt + g.output_ids)[:S]
    assert len(seq) == S
    feats = hidden_reference(target, seq, drafter.target_layer_ids)
    fresh = drafter.new_cache(S + drafter.block_size)
    block = target.embed(torch.full((drafter.block_size,), drafter.mask_token_id))
    with torch.inference_mode():
        drafter(feats, block, fresh, 0, S)
    for got, want in ((rec.cache.k, fresh.k), (rec.cache.v, fresh.v)):
        torch.testing.assert_close(got[:, :, :S], want[:, :, :S], atol=1e-4, rtol=1e-4)
    # and the check can fail: context features of a shifted sequence differ
    shifted = drafter.new_cache(S + drafter.block_size)
    with torch.inference_mode():
        drafter(hidden_reference(target, [1] + seq[:-1], drafter.target_layer_ids), block, shifted, 0, S)
    assert not torch.allclose(rec.cache.k[:, :, :S], shifted.k[:, :, :S], atol=1e-3)
