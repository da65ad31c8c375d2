"""Static-shape forwards of the target and the DFlash drafter over a batch of requests (fixed slots).

The batch-1 static forwards (forward.py) run one request against one cache. Here B requests run
in one forward: every request ("slot") owns its own region of a slotted cache - K and V tensors
of shape [layers, B, Hkv, S, D], slot i's region `k[:, i]` - and its own frontier `start[i]`
(a [B] device tensor). Per layer:
* every projection (merged q/k/v, o_proj, merged gate/up, down) runs ONE GEMM over the B*T rows of
  all slots (the weights are read once per round, which is where batching pays);
* q/k norms, RoPE and the K/V write run for every slot at once (`ops.qkv_rope_slots`: one launch of
  batch 1's kernel over the slots' rows, each into its own cache region at its own frontier; the twin is
  `ops.qkv_rope` slot by slot), so the row-wise numerics are batch 1's and a slot never writes another
  slot's region;
* attention is one launch over every slot, chosen by forward._attend's rule on one slot's shapes: with the fused
  Triton ops, a tree verify that brings its path tables (compile_trees' [B, T, L+1]) from TREE_MIN_ROWS folded
  rows runs the tree kernel with a slot axis (kernels/tree_attention.py: each slot's prefix densely, its own
  ancestors gathered), below that and for AR and the draft up to AUTO_MAX_ROWS rows the live-slot kernel with a
  slot axis (kernels/attention.py: slots < start[i] + T of region i only, split-KV); else, and on CPUs, one SDPA
  over [B, Hkv, g*T, D] queries against every slot's whole region with a per-slot additive bias [B, g*T, S]
  (forward.visible_bias rows; forward.grouped_attend with its slot axis, the kernels' twin). Either way a slot's rows see only its
  own committed prefix and its own ancestors (verify) or its own context and block (draft);
Shapes depend only on (B, T, S), so one CUDA graph per (batch bucket, budget) replays a stage.
Only the GEMMs see more rows than at batch 1, and the attention kernels split fewer KV ranges per slot (more
programs), which may change the last bits of a row; outputs stay equal token for token
(tests/engine/gpu/test_batch_loop.py; the kernels slot by slot: test_batch_attention_triton.py).

Knows nothing of how trees are built, of rounds, graphs or which slots are live (padding slots compute garbage in
their own regions and the loop ignores it).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ddtree_bench.engine.gpu.forward import _attend, _norm, checked_ops, decoder_stack, layer_stack
from ddtree_bench.engine.gpu.kernels.tree_attention import TreeRows
from ddtree_bench.engine.gpu.ops import TorchOps


def _attention_batch(attn, ops: TorchOps, h, cos, sin, k_layer, v_layer, start, bias, T: int,
                     ctx=None, ctx_cos=None, ctx_sin=None, ctx_start=None, C: int = 0, live=None, prefix=None,
                     attention: str = "sdpa", tree=None):
    """forward._attention over B slots: h [B*T, H] (normed) -> attention output [B*T, Hq*D] (o_proj's input); with ctx
    [B*C, H] (the drafter's context features) their K/V go to each slot's ctx_start[i].. first. live [B]: slots
    read per region (start + T); prefix [B] or None; attention / tree: see forward._attend."""
    qk_norm = getattr(attn, "qk_norm", True)
    q_w, eps = _norm(attn.q_norm) if qk_norm else (None, 0.0)
    k_w = attn.k_norm.weight if qk_norm else None
    if ctx is not None and C:
        rows = attn.n_heads * attn.head_dim
        b = attn.qkv_bias[rows:] if attn.qkv_bias is not None else None
        ops.qkv_rope_slots(F.linear(ctx, attn.qkv_weight[rows:], b), 0, attn.n_kv, None, k_w, eps, ctx_cos, ctx_sin,
                           k_layer, v_layer, ctx_start, C)
    q = ops.qkv_rope_slots(ops.linear(h, attn.qkv_weight, attn.qkv_bias), attn.n_heads, attn.n_kv, q_w, k_w, eps,
                           cos, sin, k_layer, v_layer, start, T)
    return _attend(ops, attention, q, k_layer, v_layer, bias, live, prefix, tree)


def target_forward_batch(target, ids: torch.Tensor, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         start: torch.Tensor, bias: torch.Tensor, hidden_layers: Sequence[int] = (),
                         ops: TorchOps | None = None, tree_path: torch.Tensor | None = None,
                         attention: str = "auto") -> tuple[torch.Tensor, torch.Tensor | None]:
    """forward.target_forward over B slots of T tokens each. ids, positions: [B*T] (slot-major);
    k, v: [layers, B, Hkv, S, D]; start: [B]; bias: [B, g*T, S]. Returns logits [B*T, V] and the
    hidden states of `hidden_layers` [B*T, n*H]. The bias must hide every slot >= start[i] + T of region i and
    show every slot < start[i] to every row of slot i (verify_visible and the AR bias do); tree_path: [B, T, L+1]
    (kernels/tree_verify.compile_trees' path tables; positions - start = depth), for the tree kernel;
    attention: auto | live | tree | sdpa, as in forward.target_forward (forward._attend)."""
    ops = checked_ops(ops, attention)
    B = start.shape[0]
    T = ids.shape[0] // B
    live = start + T
    tree = TreeRows(tree_path, positions) if tree_path is not None else None

    def attend(i, attn, h, cos, sin):
        return _attention_batch(attn, ops, h, cos, sin, k[i], v[i], start, bias, T, live=live, prefix=start,
                                attention=attention, tree=tree)
    return decoder_stack(target, ops, ids, positions, hidden_layers, attend)


def draft_forward_batch(drafter, target_hidden: torch.Tensor, block_emb: torch.Tensor, k: torch.Tensor,
                        v: torch.Tensor, ctx_start: torch.Tensor, start: torch.Tensor,
                        biases: Sequence[torch.Tensor], ops: TorchOps | None = None,
                        attention: str = "auto") -> torch.Tensor:
    """forward.draft_forward over B slots. target_hidden: [B*C, n*H] (slot i's rows for positions
    ctx_start[i]..); block_emb: [B*Tb, H] (positions start[i]..); k, v: the drafter's slotted cache;
    biases: one [B, g*Tb, S] per layer, each hiding the slots >= start[i] + Tb of region i (draft_visible does).
    Returns the normed block states [B*Tb, H]. Padding context rows land in slots start[i].. and the block's K/V
    overwrite them, as in draft_forward; attention: as in target_forward_batch (no tree, no prefix shortcut)."""
    ops = checked_ops(ops, attention)
    B = start.shape[0]
    C, Tb = target_hidden.shape[0] // B, block_emb.shape[0] // B
    dev = block_emb.device
    ctx = ops.rmsnorm(drafter.fc(target_hidden), *_norm(drafter.hidden_norm))
    cpos = (ctx_start[:, None] + torch.arange(C, device=dev)).reshape(-1)
    bpos = (start[:, None] + torch.arange(Tb, device=dev)).reshape(-1)
    ccos, csin = drafter.rotary(cpos, block_emb.dtype)
    bcos, bsin = drafter.rotary(bpos, block_emb.dtype)
    live = start + Tb

    def attend(i, attn, h):
        return _attention_batch(attn, ops, h, bcos, bsin, k[i], v[i], start, biases[i], Tb, ctx=ctx, ctx_cos=ccos,
                                ctx_sin=csin, ctx_start=ctx_start, C=C, live=live, attention=attention)
    return layer_stack(drafter.layers, drafter.norm, ops, block_emb, attend).normed
