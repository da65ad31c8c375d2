"""The hybrid / MoE target: Qwen3.5, Qwen3.5-MoE, Qwen3-Next and Qwen3-MoE decoders in plain PyTorch.

Same interface as `engine.model.Target` (forward(ids, positions, cache, start, mask, hidden_layers,
last_logits_only) -> (logits, hidden); new_cache; embed; lm_head; cfg), so the reference loops, the
drafter and `serve` take it as they are. Parameter names are Hugging Face's (`model.layers.0.linear_attn.
in_proj_qkv.weight`, ...), so a checkpoint loads as is (loading.py maps the conditional-generation prefix).

What `mask` means decides how the GDN layers run:
* "causal" (default) or None with one token: a SEQUENCE continuing the cache (prefill, an AR step);
  GDN states advance at once. Prefill uses the chunked form (`prefill_form = "chunked"`) or the step
  form ("step"); they agree to rounding.
* a bool tensor [T, start+T]: a VERIFY TREE. Its tree block is the ancestor-or-self matrix (the loops'
  `verify_mask`); attention uses it as is, GDN layers compute every node from its parent
  (tree_verify.py: `tree_mode` "depth" = one batched step per depth, "node" = the slow per-node twin,
  "flat" = the negative control), and the states wait in the cache for `cache.commit(start, accepted)`.

`forward_rows` runs several requests at once (the batched plain loop): projections, MLPs and the head
over all their tokens, attention and the recurrence per request on its own cache. Knows nothing of
drafting, walks or sampling.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ddtree_bench.engine.hybrid.attention import HybridAttention
from ddtree_bench.engine.hybrid.config import HybridConfig
from ddtree_bench.engine.hybrid.gdn import GatedDeltaNet, chunked_delta_rule, conv_apply, conv_windows, delta_step
from ddtree_bench.engine.hybrid.moe import SparseMoE
from ddtree_bench.engine.hybrid.norms import ZeroCentredRMSNorm
from ddtree_bench.engine.hybrid.state import HybridCache
from ddtree_bench.engine.hybrid.tree_verify import TREE_MODES, gdn_tree_by_depth, gdn_tree_flat, gdn_tree_per_node, tree_shape
from ddtree_bench.engine.layers import MLP, RMSNorm, Rotary, attend, causal_mask

SSM_TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HybridBlock(nn.Module):
    def __init__(self, cfg: HybridConfig, i: int):
        super().__init__()
        self.kind = cfg.layer_types[i]
        if self.kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(cfg)
        else:
            self.self_attn = HybridAttention(cfg)
        moe = cfg.moe is not None and cfg.moe.moe_layers[i]
        self.mlp = SparseMoE(cfg.hidden_size, cfg.moe) if moe else MLP(cfg.hidden_size, cfg.intermediate_size)
        norm = ZeroCentredRMSNorm if cfg.zero_centred_norms else RMSNorm
        self.input_layernorm = norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = norm(cfg.hidden_size, cfg.rms_norm_eps)


class HybridDecoder(nn.Module):
    def __init__(self, cfg: HybridConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(HybridBlock(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = (ZeroCentredRMSNorm if cfg.zero_centred_norms else RMSNorm)(cfg.hidden_size, cfg.rms_norm_eps)


class _Row:
    """One request's part of a forward (what batch_forward.TargetRow carries)."""

    def __init__(self, ids, positions, cache, start, mask):
        self.ids, self.positions, self.cache, self.start, self.mask = ids, positions, cache, start, mask


class HybridTarget(nn.Module):
    is_hybrid = True

    def __init__(self, cfg: HybridConfig):
        super().__init__()
        self.cfg = cfg
        self.model = HybridDecoder(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = Rotary(cfg.rope, cfg.rotary_dim)
        self.tree_mode = "depth"        # tree_verify.TREE_MODES
        self.commit_mode = "full"       # state.COMMIT_MODES
        self.prefill_form = "chunked"   # "chunked" | "step"
        from ddtree_bench.engine.target_variants import REFERENCE_TARGET
        self.variant = REFERENCE_TARGET

    @property
    def ssm_dtype(self) -> torch.dtype:
        return SSM_TORCH[self.cfg.ssm_dtype]

    def new_cache(self, capacity: int) -> HybridCache:
        p, c = self.lm_head.weight, self.cfg
        return HybridCache(c.layer_types, c.num_key_value_heads, c.head_dim, capacity, max(c.conv_dim, 1), c.conv_kernel,
                           max(c.linear_num_value_heads, 1), max(c.linear_key_head_dim, 1), max(c.linear_value_head_dim, 1),
                           p.dtype, self.ssm_dtype, p.device, commit_mode=self.commit_mode, crop=self.variant.gdn_crop)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(ids)

    def forward(self, ids, positions, cache: HybridCache, start: int, mask="causal", hidden_layers: Sequence[int] = (),
                last_logits_only: bool = False):
        """ids, positions: [T]; see the module docstring for `mask`. Returns (logits [T or 1, V], hidden or None)."""
        (logits, hidden), = self.forward_rows([_Row(ids, positions, cache, start, mask)], hidden_layers, last_logits_only)
        return logits, hidden

    def forward_rows(self, rows, hidden_layers: Sequence[int] = (), last_logits_only: bool = False):
        """Per request (logits, hidden) as `forward` gives for each alone (rows: ids, positions, cache, start, mask)."""
        if self.tree_mode not in TREE_MODES:
            raise ValueError(f"tree_mode must be one of {TREE_MODES}")
        spans, at = [], 0
        plans = []
        for r in rows:
            T = int(r.ids.shape[0])
            spans.append((at, at + T))
            at += T
            tree = not isinstance(r.mask, str) and r.mask is not None
            if r.mask is None and T > 1:
                raise ValueError("hybrid target: mask=None over several tokens has no recurrent meaning; pass 'causal' or a tree mask")
            r.cache.commit_mode, r.cache.crop = self.commit_mode, self.variant.gdn_crop
            r.cache.begin(r.start, tree)
            if tree:
                if r.start and not bool(r.mask[:, :r.start].all()):
                    raise ValueError("hybrid target: a tree mask must show every committed slot to every node")
                shape = tree_shape(r.mask[:, r.start:], self.cfg.conv_kernel) if self.cfg.gdn_layers else None
                plans.append(("tree", r.mask, shape))
            else:
                plans.append(("seq", causal_mask(r.start, T, r.ids.device) if T > 1 else None, None))
        ids = torch.cat([r.ids for r in rows])
        x = self.model.embed_tokens(ids)
        cos, sin = self.rotary(torch.cat([r.positions for r in rows]), x.dtype)
        wanted = {l: None for l in hidden_layers}
        last = len(self.model.layers) - 1
        for i, block in enumerate(self.model.layers):
            h = block.input_layernorm(x)
            if block.kind == "full_attention":
                mix = self._attention(block.self_attn, i, h, cos, sin, rows, spans, plans)
            else:
                mix = self._gdn(block.linear_attn, i, h, rows, spans, plans)
            x = x + mix
            x = x + block.mlp(block.post_attention_layernorm(x))
            if i in wanted and i != last:
                wanted[i] = x
        x = self.model.norm(x)
        if last in wanted:
            wanted[last] = x
        hidden = torch.cat([wanted[l] for l in hidden_layers], dim=-1) if hidden_layers else None
        for r, (s, e) in zip(rows, spans):
            if not isinstance(r.mask, torch.Tensor):
                r.cache.advanced(e - s)
        out = []
        for r, (s, e) in zip(rows, spans):
            xs = x[e - 1:e] if last_logits_only else x[s:e]
            out.append((self.lm_head(xs), hidden[s:e] if hidden is not None else None))
        return out

    def _attention(self, a: HybridAttention, i, h, cos, sin, rows, spans, plans):
        q, k, v, gate = a.project(h, cos, sin)
        outs = []
        for r, (s, e), (_, mask, _) in zip(rows, spans, plans):
            r.cache.write(i, r.start, k[:, s:e], v[:, s:e])
            keys, values = r.cache.view(i, r.start + (e - s))
            outs.append(attend(q[:, s:e], keys, values, mask))
        return a.output(torch.cat(outs), gate)

    def _gdn(self, gdn: GatedDeltaNet, i, h, rows, spans, plans):
        u, z, beta, g = gdn.inputs(h)
        outs = []
        for r, (s, e), (kind, _, shape) in zip(rows, spans, plans):
            st = r.cache.states[i]
            if kind == "seq":
                o = self._gdn_sequence(gdn, st, u[s:e], g[s:e], beta[s:e])
            else:
                o = self._gdn_tree(gdn, r.cache, i, st, u[s:e], g[s:e], beta[s:e], shape)
            outs.append(o)
        return gdn.output(torch.cat(outs), z, h.dtype)

    def _gdn_sequence(self, gdn: GatedDeltaNet, st, u, g, beta):
        """A sequence from the committed state; the state advances in place."""
        T, K = u.shape[0], gdn.K
        buf = torch.cat([st.conv, u])
        idx = torch.arange(T, device=u.device)[:, None] + torch.arange(K, device=u.device)[None, :]
        q, k, v = gdn.qkv(conv_apply(conv_windows(buf, idx), gdn.conv_weight(), u.dtype))
        if T > 1 and self.prefill_form == "chunked":
            o, S = chunked_delta_rule(q, k, v, g, beta, st.S.float())
        else:
            S, os = st.S.float()[None], []
            for t in range(T):
                S, o_t = delta_step(S, q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1])
                S = S.to(self.ssm_dtype).float()
                os.append(o_t)
            o, S = torch.cat(os), S[0]
        st.S.copy_(S.to(self.ssm_dtype))
        st.conv.copy_(buf[buf.shape[0] - (K - 1):])
        return o

    def _gdn_tree(self, gdn, cache: HybridCache, i, st, u, g, beta, shape):
        if self.tree_mode == "depth":
            keep = cache.commit_mode == "full" and not cache.crop
            o, stash = gdn_tree_by_depth(gdn, st.conv, st.S, u, g, beta, shape, keep, self.ssm_dtype)
        elif self.tree_mode == "node":
            o, stash = gdn_tree_per_node(gdn, st.conv, st.S, u, g, beta, shape.parents.tolist(), self.ssm_dtype)
        else:
            o, stash = gdn_tree_flat(gdn, st.conv, st.S, u, g, beta, self.ssm_dtype)
        cache.pending[i] = stash
        return o
