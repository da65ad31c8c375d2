"""Static-shape forwards of the target and the DFlash drafter, for CUDA-graph capture.

The plain forwards (model.py, draft.py) slice the KV cache to the live frontier with Python ints,
so every round has new shapes. Here every shape depends only on the number of query tokens:
* the frontier `start` is a 0-d device tensor; new K/V go to slots start + arange(T), written by
  the layer ops' `qkv_rope` (fused.py);
* an additive bias [T, capacity] (0 = visible, -inf = hidden) hides the slots past the frontier, as
  gpt-fast does. With the fused Triton ops (CUDA) attention over up to AUTO_MAX_ROWS folded query rows
  (AR, the draft, trees to ~190 nodes) reads only the live slots, < start + T, whose count the kernel
  reads from the device (kernels/attention.py), so a captured graph stays valid as the prefix grows
  and its cost follows the live length, not the capacity; the target's verify also skips the bias
  over the committed prefix (every row sees it). A tree verify of >= 8 nodes (TREE_MIN_ROWS folded
  rows, over one slot or many) that brings its path table (the fused tree compile's) reads the
  prefix densely and gathers each row's <= L+1 ancestors instead of any bias (kernels/tree_attention.py).
  Larger trees without it, the PyTorch ops, CPUs and `attention="sdpa"` run `grouped_attend`, SDPA over
  the whole preallocated cache (the kernel's twin; on an H200 SDPA's cuDNN flash kernel beat it there even
  over the whole cache);
* grouped-query attention folds the query-head group into the query axis ([Hkv, g*T, D] against
  K/V [Hkv, S, D]), so SDPA sees plain multi-head attention with a mask and can use any fused
  kernel (the memory-efficient one refuses `enable_gqa=True`); it is faster than the plain `attend`
  (measured in docs/gpu-performance.md). The bias comes already repeated g times;
* q/k/v and gate/up run as one GEMM each on merged weights (`fused.merge_projections`, which makes
  the modules' own weights views of them). Every weight GEMM and the elementwise work between them
  go through `ops` (`linear`, `swiglu` with its SiLU-mul, `linear_add_rmsnorm` for a block's output
  projection with the residual add and the next norm): the fused Triton kernels on CUDA, with
  kernels/gemm.py's few-row GEMM where its table has the shape, or their PyTorch twin (`fused.ops_for`);
* the layer loop is written once (`layer_stack`, the target's embedding and head around it in `decoder_stack`): the
  target's and the drafter's forwards, here and in batch_forward.py, differ only in the attention they hand it.

The weights are the modules' own, so logits equal the plain forwards up to floating-point
reduction order (tests/engine/gpu/test_fastpath.py, tests/engine/gpu/test_fused.py). Knows nothing of trees, rounds or graphs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ddtree_bench.engine.cache import KVCache
from ddtree_bench.engine.gpu.fused import ensure_merged
from ddtree_bench.engine.gpu.kernels import attention as live_kernel
from ddtree_bench.engine.gpu.kernels import tree_attention as tree_kernel
from ddtree_bench.engine.gpu.ops import TORCH_OPS, TorchOps

NEG_INF = float("-inf")


class StaticKV:
    """A KVCache seen with static shapes: `view` returns a layer's every slot ([Hkv, capacity, D]
    each for K and V); the layer ops write slots start + arange(T) of it (start: 0-d device tensor)."""

    def __init__(self, cache: KVCache):
        self.cache = cache

    @property
    def capacity(self) -> int:
        return self.cache.capacity

    def view(self, layer: int, end=None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.k[layer], self.cache.v[layer]


def visible_bias(visible: torch.Tensor, dtype: torch.dtype, group: int) -> torch.Tensor:
    """[..., T, S] bool -> additive [..., group*T, S] bias in `dtype` (0 visible, -inf hidden), rows repeated per
    group (a leading slot axis: each slot's rows repeated within its own bias)."""
    bias = torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, NEG_INF)
    return bias.repeat(*([1] * (bias.dim() - 2)), group, 1) if group > 1 else bias


def grouped_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """q: [Hq, T, D]; k, v: [Hkv, S, D]; bias: [g*T, S] with g = Hq // Hkv. Returns [T, Hq*D].
    With a leading slot axis (batch_forward.py's slotted caches): q [C, Hq, T, D], k, v [C, Hkv, S, D], bias
    [C, g*T, S] -> [C*T, Hq*D] slot-major, each slot against its own region (the slotted kernels' twin).

    Query head h uses KV head h // g (HF's repeat_kv), so q.view(Hkv, g, T, D) lines the group up
    with its KV head; folding (g, T) into one query axis makes it plain multi-head attention."""
    if q.dim() == 3:   # one slot
        q, k, v, bias = q[None], k[None], v[None], bias[None]
    C, Hq, T, D = q.shape
    Hkv = k.shape[1]
    g = Hq // Hkv
    out = F.scaled_dot_product_attention(q.reshape(C, Hkv, g * T, D), k, v, attn_mask=bias[:, None])
    return out.reshape(C, Hq, T, D).transpose(1, 2).reshape(C * T, Hq * D)


ATTENTION = ("auto", "sdpa", "live", "tree")


def checked_ops(ops: TorchOps | None, attention: str) -> TorchOps:
    """The layer ops a forward runs (default the PyTorch twin), once `attention` is known to be one of ATTENTION."""
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {ATTENTION}, got {attention!r}")
    return ops or TORCH_OPS


def _attend(ops: TorchOps, attention: str, q, k, v, bias, live, prefix, tree=None) -> torch.Tensor:
    """grouped_attend's result. A tree verify (`tree`: tree_attention.TreeRows, with `prefix`) of at least
    TREE_MIN_ROWS folded query rows (one slot's, however many slots) under auto with the fused Triton ops, or
    attention="tree": the prefix densely and each row's ancestors gathered (kernels/tree_attention.py), the bias
    unread; attention="live", or auto with the fused ops up to AUTO_MAX_ROWS query rows: over the live slots only
    (kernels/attention.py); else SDPA over every slot. With a leading slot axis (batch_forward.py: every argument
    per slot) the same rule on one slot's shapes, and every kernel over all slots in one launch."""
    one_q, one_k = (q[0], k[0]) if q.dim() == 4 else (q, k)
    if tree is not None and prefix is not None and (
            attention == "tree" or (attention == "auto" and ops.name == "triton"
                                    and tree_kernel.wanted(one_q, one_k, q.shape[0] if q.dim() == 4 else 1))):
        return tree_kernel.tree_attend(q, k, v, tree.path, tree.pos, prefix, words=tree.words(prefix))
    if attention == "live" or (attention == "auto" and ops.name == "triton" and live_kernel.wanted(one_q, one_k)):
        return live_kernel.live_attend(q, k, v, bias, live, prefix)
    return grouped_attend(q, k, v, bias)


def _norm(module) -> tuple[torch.Tensor, float]:
    return module.weight, module.eps


def _attention(attn, ops: TorchOps, h, cos, sin, kv: StaticKV, layer: int, start, bias,
               ctx=None, ctx_cos=None, ctx_sin=None, ctx_start=None, live=None, prefix=None, attention: str = "sdpa",
               tree=None):
    """One attention layer of the target (ctx None) or the drafter (ctx = context features to cache
    first) on merged q/k/v weights: h [T, H] (normed) -> attention output [T, Hq*D] (o_proj's input: `_residual`). live: 0-d, slots read
    (start + T); prefix: 0-d or None, slots every row sees (the bias is not read there); see _attend."""
    qk_norm = getattr(attn, "qk_norm", True)  # the drafter's attention always has q/k norms
    q_w, eps = _norm(attn.q_norm) if qk_norm else (None, 0.0)
    k_w = attn.k_norm.weight if qk_norm else None
    k_cache, v_cache = kv.view(layer)
    if ctx is not None and ctx.shape[0]:
        rows = attn.n_heads * attn.head_dim  # the k and v rows of the merged weight
        b = attn.qkv_bias[rows:] if attn.qkv_bias is not None else None
        ops.qkv_rope(F.linear(ctx, attn.qkv_weight[rows:], b), 0, attn.n_kv, None, k_w, eps, ctx_cos, ctx_sin,
                     k_cache, v_cache, ctx_start)
    qkv = ops.linear(h, attn.qkv_weight, attn.qkv_bias)
    q = ops.qkv_rope(qkv, attn.n_heads, attn.n_kv, q_w, k_w, eps, cos, sin, k_cache, v_cache, start)
    return _attend(ops, attention, q, k_cache, v_cache, bias, live, prefix, tree)


def _linear(ops: TorchOps, module, x):
    """An nn.Linear's forward through the ops' weight GEMM."""
    return ops.linear(x, module.weight, module.bias)


def _swiglu(mlp, ops: TorchOps, h):
    """The MLP up to down_proj's input: silu(gate) * up on the merged gate/up weight."""
    return ops.swiglu(h, mlp.gate_up_weight, mlp.gate_up_bias)


def _residual(ops: TorchOps, x, inner, linear, norm):
    """(x + linear(inner), its RMSNorm under `norm`): a block's output projection, residual add and the next
    norm as one op (ops.linear_add_rmsnorm)."""
    return ops.linear_add_rmsnorm(x, inner, linear.weight, linear.bias, *_norm(norm))


def group_size(module) -> int:
    """Query heads per KV head of a target or drafter."""
    attn = module.model.layers[0].self_attn if hasattr(module, "model") else module.layers[0].self_attn
    return attn.n_heads // attn.n_kv


def target_forward(target, ids: torch.Tensor, positions: torch.Tensor, kv: StaticKV, start: torch.Tensor,
                   bias: torch.Tensor, hidden_layers: Sequence[int] = (), ops: TorchOps | None = None,
                   attention: str = "auto", tree_path: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Same contract as Target.forward with a static cache: logits [T, V] and the hidden states of
    `hidden_layers` concatenated [T, n*H] (the last layer's after the final norm, as HF returns it).
    ops: the fused layer ops (fused.ops_for), default the PyTorch twin. The bias must hide every slot
    >= start + T and show every slot < start to every row (verify_visible and the AR bias do);
    attention: auto | live | tree | sdpa (see _attend); tree_path: [T, L+1] the node at each depth of every
    row's path (kernels/tree_verify.compile_tree), for the tree kernel (positions - start = depth)."""
    ops = checked_ops(ops, attention)
    live = start + ids.shape[0]
    tree = tree_kernel.TreeRows(tree_path, positions) if tree_path is not None else None

    def attend(i, attn, h, cos, sin):
        return _attention(attn, ops, h, cos, sin, kv, i, start, bias, live=live, prefix=start, attention=attention,
                          tree=tree)
    return decoder_stack(target, ops, ids, positions, hidden_layers, attend)


def decoder_stack(target, ops: TorchOps, ids: torch.Tensor, positions: torch.Tensor, hidden_layers: Sequence[int],
                  attend) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The target around its attention, for target_forward and batch_forward.target_forward_batch: embed `ids`
    [rows], layer_stack with attend(layer, self_attn, h, cos, sin) (the rotary tables of `positions`), the LM head.
    Returns the logits [rows, V] and the hidden states of `hidden_layers` [rows, n*H]."""
    x = target.model.embed_tokens(ids)
    cos, sin = target.rotary(positions, x.dtype)
    stack = layer_stack(target.model.layers, target.model.norm, ops, x,
                        lambda i, attn, h: attend(i, attn, h, cos, sin), hidden_layers)
    return _linear(ops, target.lm_head, stack.normed), stack.hidden


class Stack(NamedTuple):
    """What layer_stack returns: the last layer's output after the final norm [rows, H], and the residual states of
    the asked-for layers concatenated [rows, n*H] (the last layer's after the final norm, as HF returns it; None
    without any)."""

    normed: torch.Tensor
    hidden: torch.Tensor | None


def layer_stack(layers, final_norm, ops: TorchOps, x: torch.Tensor, attend,
                hidden_layers: Sequence[int] = ()) -> Stack:
    """Pre-norm decoder layers over the residual stream x [rows, H], written once for the target's and the drafter's
    forwards: per layer attend(layer, self_attn, h) -> the attention output [rows, Hq*D] (o_proj's input; h the
    normed stream), o_proj with the residual add and the post-attention norm as one op, the SwiGLU MLP and down with
    the add and the next layer's input norm (`final_norm` after the last). Returns a Stack: the last h (after
    `final_norm`) and the states of `hidden_layers`. Merges the layers' projections first if they are not
    (fused.ensure_merged: the forward's guard)."""
    ensure_merged(layers)
    h = ops.rmsnorm(x, *_norm(layers[0].input_layernorm))
    wanted = {l: None for l in hidden_layers}
    last = len(layers) - 1
    for i, layer in enumerate(layers):
        x, h = _residual(ops, x, attend(i, layer.self_attn, h), layer.self_attn.o_proj, layer.post_attention_layernorm)
        nxt = layers[i + 1].input_layernorm if i < last else final_norm
        x, h = _residual(ops, x, _swiglu(layer.mlp, ops, h), layer.mlp.down_proj, nxt)   # h: the next layer's input
        if i in wanted:
            wanted[i] = h if i == last else x
    return Stack(h, torch.cat([wanted[l] for l in hidden_layers], dim=-1) if hidden_layers else None)


def draft_visible(drafter, layer: int, start: torch.Tensor, Tb: int, capacity: int) -> torch.Tensor:
    """[Tb, capacity] bool visibility of the block rows at start.. in drafter layer `layer`:
    slots < start + Tb (the context plus the whole block), narrowed for causal / sliding layers.
    start [C] (the batched loop's frontiers): [C, Tb, capacity], slot c's rows at start[c].., in one set of ops."""
    dev = start.device
    s = start[..., None, None]   # 0-d: [1, 1]; [C]: [C, 1, 1]
    q = s + torch.arange(Tb, device=dev)[:, None]
    k = torch.arange(capacity, device=dev)[None, :]
    ok = k < s + Tb
    if drafter.cfg.layer_causal[layer]:
        ok = ok & (k <= q)
    window = drafter.cfg.layer_window[layer]
    if window is not None:
        ok = ok & ((q - k) < window)
        if not drafter.cfg.layer_causal[layer]:
            ok = ok & ((k - q) < window)
    return ok.expand(*start.shape, Tb, capacity)


def draft_forward(drafter, target_hidden: torch.Tensor, block_emb: torch.Tensor, kv: StaticKV,
                  ctx_start: torch.Tensor, start: torch.Tensor, biases: Sequence[torch.Tensor],
                  ops: TorchOps | None = None, attention: str = "auto") -> torch.Tensor:
    """Same contract as DFlashDrafter.forward with a static cache. target_hidden: [C, n*H] for
    positions ctx_start..; block_emb: [Tb, H] for positions start..; biases: one [g*Tb, S] per layer.

    C may exceed start - ctx_start (padding): the extra context rows land in slots start.. and the
    block's own K/V, written after them in every layer, overwrite them before anything reads them.
    Every bias must hide the slots >= start + Tb (draft_visible does); attention: as target_forward."""
    ops = checked_ops(ops, attention)
    C, Tb = target_hidden.shape[0], block_emb.shape[0]
    dev = block_emb.device
    ctx = ops.rmsnorm(drafter.fc(target_hidden), *_norm(drafter.hidden_norm))
    positions = torch.cat([ctx_start + torch.arange(C, device=dev), start + torch.arange(Tb, device=dev)])
    cos, sin = drafter.rotary(positions, block_emb.dtype)
    live = start + Tb

    def attend(i, attn, h):
        return _attention(attn, ops, h, cos[C:], sin[C:], kv, i, start, biases[i], ctx=ctx, ctx_cos=cos[:C],
                          ctx_sin=sin[:C], ctx_start=ctx_start, live=live, attention=attention)
    return layer_stack(drafter.layers, drafter.norm, ops, block_emb, attend).normed
