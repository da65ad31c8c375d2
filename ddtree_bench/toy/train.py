"""Training the bundled toy pair: a byte-level Qwen3 target, then a DFlash drafter against it.

Stage 1 (target): next-token cross-entropy on windows of the offline corpus (toy/corpus.py).
Stage 2 (distill): the trained target greedily continues many contexts (chat prompts exactly as
  evaluation renders them, and random corpus windows), so the drafter learns the *target's* greedy
  continuations, as z-lab trains its drafters on target-regenerated responses.
Stage 3 (drafter): the DFlash objective. Context features are the frozen target's hidden states at
  `target_layer_ids`; blocks [anchor, mask x 15] sit at random anchors inside the greedy part; each
  block's queries see the context strictly before its anchor plus its own 16 positions (non-causal,
  exactly what the engine's drafter sees at inference); cross-entropy on the 15 drafted positions
  through the target's (frozen, tied) embedding / lm_head, with weights decaying with depth.
The result is written as a Hugging Face Qwen3ForCausalLM directory and a z-lab DFlash directory.

Batched training forwards live here (the engine is batch-1 and cache-bound); tests check that they
agree with the engine's `Target` / `DFlashDrafter` forwards. Knows nothing of suites or HTTP beyond
the corpus module.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from ddtree_bench.engine.config import parse_draft_config, parse_target_config
from ddtree_bench.engine.draft import DFlashDrafter
from ddtree_bench.engine.layers import apply_rope
from ddtree_bench.engine.loading import save_hf
from ddtree_bench.engine.model import Target
from ddtree_bench.toy import tokenizer as btok


@dataclass
class Recipe:
    """Every knob of `ddtree-bench toy train`; the defaults are the recipe of the committed pair."""

    seed: int = 0
    # target
    hidden: int = 256
    layers: int = 5
    heads: int = 8
    kv_heads: int = 4
    intermediate: int = 768
    seq_len: int = 1024
    target_batch: int = 64
    target_steps: int = 2000
    target_lr: float = 2e-3
    # distillation set
    distill_contexts: int = 16384
    distill_new_tokens: int = 192
    distill_batch: int = 1024
    prompt_fraction: float = 0.6            # contexts that are chat prompts exactly as evaluated
    # drafter
    draft_layers: int = 2
    draft_intermediate: int = 768
    target_layer_ids: tuple[int, ...] = (1, 2, 3)
    block_size: int = 16
    draft_batch: int = 64
    anchors_per_seq: int = 16
    draft_steps: int = 3000
    draft_lr: float = 1.5e-3
    depth_decay: float = 8.0                # loss weight of depth k: exp(-(k-1)/depth_decay)
    warmup_steps: int = 100
    weights: dict[str, float] = field(default_factory=lambda: {"code": 0.25, "code_chat": 0.15, "gsm8k": 0.4, "chat": 0.2})


def _qwen3_fields(r: Recipe, layers: int, intermediate: int) -> dict[str, Any]:
    """The Qwen3 config keys the target and the drafter share (same width, heads, RoPE, vocabulary)."""
    return {
        "model_type": "qwen3",
        "vocab_size": btok.VOCAB_SIZE,
        "hidden_size": r.hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": r.heads,
        "num_key_value_heads": r.kv_heads,
        "head_dim": r.hidden // r.heads,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    }


def target_config(r: Recipe) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        **_qwen3_fields(r, r.layers, r.intermediate),
        "use_sliding_window": False,
        "bos_token_id": None,
        "eos_token_id": btok.IM_END,
        "pad_token_id": btok.ENDOFTEXT,
    }


def draft_config(r: Recipe) -> dict[str, Any]:
    return {
        "architectures": ["DFlashDraftModel"],
        **_qwen3_fields(r, r.draft_layers, r.draft_intermediate),
        "block_size": r.block_size,
        "num_target_layers": r.layers,
        "layer_types": ["full_attention"] * r.draft_layers,
        "dflash_config": {"mask_token_id": btok.MASK, "target_layer_ids": list(r.target_layer_ids)},
    }


# ---------------------------------------------------------------------------- batched forwards


def _heads(x: torch.Tensor, n: int, d: int) -> torch.Tensor:
    B, T, _ = x.shape
    return x.view(B, T, n, d).transpose(1, 2)  # [B, n, T, d]


def _rope_tables(rotary, positions: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = rotary(positions.reshape(-1), dtype)
    shape = (*positions.shape, cos.shape[-1])
    return cos.view(shape).unsqueeze(1), sin.view(shape).unsqueeze(1)  # [B, 1, T, D]


def lm_forward(target: Target, ids: torch.Tensor, hidden_layers=(), cache: list | None = None, pos0: int = 0,
               pad_left: torch.Tensor | None = None):
    """Batched causal forward. ids [B, T] -> logits [B, T, V], hidden [B, T, n*H] (or None).

    cache: per-layer preallocated (K, V) [B, Hkv, S, D]; this call's K/V are written at slots
    pos0 .. pos0+T-1 and attention covers slots [0, pos0+T). pad_left [B]: rows are left-padded by
    that many slots, which get no attention and shift the row's positions (slot s = position s - pad)."""
    B, T = ids.shape
    cfg = target.cfg
    dev = ids.device
    x = target.model.embed_tokens(ids)
    slots = torch.arange(pos0, pos0 + T, device=dev).expand(B, T)
    pos = slots if pad_left is None else (slots - pad_left[:, None]).clamp(min=0)
    cos, sin = _rope_tables(target.rotary, pos, x.dtype)
    S = pos0 + T
    mask = None
    if pad_left is not None or (cache is not None and T > 1):
        keys = torch.arange(S, device=dev)
        mask = keys[None, None, :] <= slots[:, :, None]
        if pad_left is not None:  # a pad slot sees only itself, so no row is empty
            mask = (mask & (keys[None, None, :] >= pad_left[:, None, None])) | (keys[None, None, :] == slots[:, :, None])
        mask = mask[:, None]
    wanted, last = {}, cfg.num_hidden_layers - 1
    for i, blk in enumerate(target.model.layers):
        a = blk.self_attn
        h = blk.input_layernorm(x)
        q = _heads(a.q_proj(h), a.n_heads, a.head_dim)
        k = _heads(a.k_proj(h), a.n_kv, a.head_dim)
        v = _heads(a.v_proj(h), a.n_kv, a.head_dim)
        if a.qk_norm:
            q, k = a.q_norm(q), a.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            K, V = cache[i]
            K[:, :, pos0:S] = k
            V[:, :, pos0:S] = v
            k, v = K[:, :, :S], V[:, :, :S]
        gqa = a.n_heads != a.n_kv
        if mask is not None:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        else:  # no padding: plain causal (T > 1 without cache) or one query seeing every cached slot
            o = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None and T > 1, enable_gqa=gqa)
        x = x + a.o_proj(o.transpose(1, 2).reshape(B, T, -1))
        x = x + blk.mlp(blk.post_attention_layernorm(x))
        if i in hidden_layers and i != last:
            wanted[i] = x
    x = target.model.norm(x)
    if last in hidden_layers:
        wanted[last] = x
    hidden = torch.cat([wanted[l] for l in hidden_layers], dim=-1) if hidden_layers else None
    return target.lm_head(x), hidden


@torch.no_grad()
def greedy_continue(target: Target, ctx: torch.Tensor, n_new: int, pad_left: torch.Tensor | None = None) -> torch.Tensor:
    """Batched greedy decoding with a preallocated KV cache: ctx [B, C] (optionally left-padded)
    -> the next n_new tokens [B, n_new]."""
    B, C = ctx.shape
    c = target.cfg
    dtype = torch.bfloat16 if (ctx.device.type == "cuda" and torch.is_autocast_enabled("cuda")) else target.lm_head.weight.dtype
    cache = [tuple(torch.zeros(B, c.num_key_value_heads, C + n_new, c.head_dim, device=ctx.device, dtype=dtype) for _ in range(2))
             for _ in range(c.num_hidden_layers)]
    logits, _ = lm_forward(target, ctx, cache=cache, pad_left=pad_left)
    nxt = logits[:, -1].argmax(-1)
    out = [nxt]
    for step in range(1, n_new):
        logits, _ = lm_forward(target, nxt[:, None], cache=cache, pos0=C + step - 1, pad_left=pad_left)
        nxt = logits[:, -1].argmax(-1)
        out.append(nxt)
    return torch.stack(out, dim=1)


def draft_visibility(drafter: DFlashDrafter, T: int, anchors: torch.Tensor) -> list[torch.Tensor]:
    """Per drafter layer, [B, 1, k*bs, T + k*bs] bool: which context and block keys each block query sees.

    Block j's query at position p = a_j + i sees context positions c < a_j and its own block's keys;
    in a causal layer only keys at positions <= p; with a sliding window W only keys with p - k < W
    (and k - p < W in a non-causal layer): the engine's `DFlashDrafter.layer_mask`, batched."""
    B, k = anchors.shape
    bs = drafter.block_size
    dev = anchors.device
    offs = torch.arange(bs, device=dev)
    qpos = (anchors[:, :, None] + offs).view(B, k * bs)                       # [B, k*bs]
    a_of_q = anchors.repeat_interleave(bs, dim=1)                              # [B, k*bs]
    cpos = torch.arange(T, device=dev)
    blk = torch.arange(k * bs, device=dev) // bs
    same_blk = (blk[:, None] == blk[None, :])                                   # [k*bs, k*bs]
    kpos_blk = qpos                                                             # block keys sit at the query positions
    masks: dict[tuple[bool, int | None], torch.Tensor] = {}
    out = []
    for causal, window in zip(drafter.cfg.layer_causal, drafter.cfg.layer_window):
        key = (causal, window)
        if key not in masks:
            see_ctx = cpos[None, None, :] < a_of_q[:, :, None]                  # [B, k*bs, T]
            see_blk = same_blk[None].expand(B, -1, -1)
            dq_ctx = qpos[:, :, None] - cpos[None, None, :]
            dq_blk = qpos[:, :, None] - kpos_blk[:, None, :]
            if causal:
                see_blk = see_blk & (dq_blk >= 0)
            if window is not None:
                see_ctx = see_ctx & (dq_ctx < window)
                see_blk = see_blk & (dq_blk < window)
                if not causal:
                    see_blk = see_blk & (-dq_blk < window)
            masks[key] = torch.cat([see_ctx, see_blk], dim=2)[:, None]
        out.append(masks[key])
    return out


def draft_forward(drafter: DFlashDrafter, embed, lm_head, feats: torch.Tensor, ids: torch.Tensor,
                  anchors: torch.Tensor) -> torch.Tensor:
    """DFlash training forward for k blocks per sequence, with per-layer (sliding / full) visibility.

    feats [B, T, n*H] target features; ids [B, T]; anchors [B, k]: block j = [ids[a_j], mask x 15] at
    positions a_j .. a_j+15. Returns draft logits [B, k, bs-1, V] for positions a_j+1 .. a_j+bs-1."""
    B, T, _ = feats.shape
    k = anchors.shape[1]
    bs = drafter.block_size
    dev = ids.device
    ctx = drafter.hidden_norm(drafter.fc(feats))                               # [B, T, H]
    block_ids = torch.full((B, k, bs), drafter.mask_token_id, dtype=torch.long, device=dev)
    block_ids[:, :, 0] = torch.gather(ids, 1, anchors)
    x = embed(block_ids).view(B, k * bs, -1)
    bpos = (anchors[:, :, None] + torch.arange(bs, device=dev)).view(B, k * bs)
    cpos = torch.arange(T, device=dev).expand(B, T)
    ccos, csin = _rope_tables(drafter.rotary, cpos, x.dtype)
    bcos, bsin = _rope_tables(drafter.rotary, bpos, x.dtype)
    masks = draft_visibility(drafter, T, anchors)
    for layer, mask in zip(drafter.layers, masks):
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q = apply_rope(a.q_norm(_heads(a.q_proj(h), a.n_heads, a.head_dim)), bcos, bsin)
        kc = apply_rope(a.k_norm(_heads(a.k_proj(ctx), a.n_kv, a.head_dim)), ccos, csin)
        kb = apply_rope(a.k_norm(_heads(a.k_proj(h), a.n_kv, a.head_dim)), bcos, bsin)
        vc, vb = _heads(a.v_proj(ctx), a.n_kv, a.head_dim), _heads(a.v_proj(h), a.n_kv, a.head_dim)
        o = F.scaled_dot_product_attention(q, torch.cat([kc, kb], 2), torch.cat([vc, vb], 2), attn_mask=mask,
                                           enable_gqa=a.n_heads != a.n_kv)
        x = x + a.o_proj(o.transpose(1, 2).reshape(B, k * bs, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    x = drafter.norm(x).view(B, k, bs, -1)[:, :, 1:]
    return lm_head(x)


class Sampler:
    """Random windows of the corpus by source weight, and evaluation-shaped chat prompts."""

    def __init__(self, corpus, seed: int):
        self.c = corpus
        self.rng = np.random.default_rng(seed)
        names = list(corpus.weights)
        self.names = names
        w = np.array([corpus.weights[n] for n in names], dtype=float)
        self.p = w / w.sum()

    def windows(self, batch: int, length: int) -> np.ndarray:
        """`batch` windows of `length` tokens, each from a source long enough for it (by source weight)."""
        fits = np.array([self.c.streams[n].size > length for n in self.names])
        if not fits.any():
            from ddtree_bench.errors import UsageError

            longest = max(self.c.streams[n].size for n in self.names)
            raise UsageError(f"the corpus is too small: its longest source has {longest} tokens, a training window "
                             f"needs {length + 1}", hint="use more --max-files (or none: the whole bundled corpus)")
        p = self.p * fits
        src = self.rng.choice(len(self.names), size=batch, p=p / p.sum())
        out = np.empty((batch, length), dtype=np.int64)
        for i, s in enumerate(src):
            stream = self.c.streams[self.names[s]]
            j = self.rng.integers(0, stream.size - length)
            out[i] = stream[j : j + length]
        return out

    def has_prompt(self, max_len: int) -> bool:
        """Whether any source has an evaluation-shaped prompt of at most `max_len` tokens (else `prompt` never returns one)."""
        return any(p.size <= max_len for n in self.names for p in (self.c.prompts.get(n) or []))

    def prompt(self, max_len: int) -> np.ndarray | None:
        names = [n for n in self.names if self.c.prompts.get(n)]
        w = np.array([self.c.weights[n] for n in names], dtype=float)
        name = names[self.rng.choice(len(names), p=w / w.sum())]
        cands = self.c.prompts[name]
        p = cands[self.rng.integers(len(cands))]
        return p if p.size <= max_len else None


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def draft_anchors(starts: torch.Tensor, ends: torch.Tensor, block_size: int, per_row: int, gen: torch.Generator,
                  device: torch.device) -> torch.Tensor:
    """`per_row` block anchors a per row, uniform over [max(start - 1, 1), end - block_size]: the anchor may be the
    last context token (start - 1), and the labels a+1 .. a+block_size-1 stay inside the greedy part (< end).
    `starts` / `ends` are the chosen rows' greedy spans; draws from the CPU generator `gen`. [rows, per_row]."""
    lo = (starts - 1).clamp(min=1)
    span = (ends - block_size) - lo
    u = torch.rand(len(starts), per_row, generator=gen).to(device)
    return lo[:, None] + (u * (span[:, None] + 1)).long().clamp(max=span[:, None])


def depth_weights(block_size: int, depth_decay: float, device: torch.device) -> torch.Tensor:
    """Loss weight of block position d = 1..block_size-1: w_d = exp(-(d - 1) / depth_decay), fp32 [block_size - 1]."""
    return torch.exp(-torch.arange(block_size - 1, device=device, dtype=torch.float32) / depth_decay)


def draft_loss(logits: torch.Tensor, ids: torch.Tensor, anchors: torch.Tensor,
               wdepth: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The DFlash objective: cross-entropy of each block position d = 1..L (L = block_size - 1) against the token
    at anchor + d, weighted by depth, loss = mean over blocks of sum_d w_d * CE_d / sum_d w_d. `logits` is
    [rows, anchors, L, V]. Returns (loss, labels [rows, anchors, L])."""
    rows, k, L = anchors.shape[0], anchors.shape[1], wdepth.shape[0]
    offsets = torch.arange(1, L + 1, device=ids.device)
    labels = torch.gather(ids, 1, (anchors[:, :, None] + offsets).view(rows, -1)).view(rows, k, L)
    ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
    return (ce.view(-1, L) * wdepth).sum(-1).mean() / wdepth.sum(), labels


def optimizer_step(opt: torch.optim.Optimizer, params: list[torch.Tensor], loss: torch.Tensor) -> None:
    """One AdamW step on `loss`, gradients clipped to norm 1."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()


def continue_rows(continue_fn: Callable, model, rows: list[np.ndarray], n_new: int, seq_len: int,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedily continue contexts of different lengths in one batch: left-pad them with ENDOFTEXT, run
    `continue_fn(model, ctx, n_new, pad_left=...)` (this module's `greedy_continue`, or the hybrid recipe's),
    then unpad: each row's context at slot 0 and its continuation right after it, in a [rows, seq_len] tensor
    filled with ENDOFTEXT. Returns that tensor and each row's context length."""
    C = max(len(x) for x in rows)
    ctx = torch.full((len(rows), C), btok.ENDOFTEXT, dtype=torch.long)
    pad = torch.tensor([C - len(x) for x in rows])
    for i, x in enumerate(rows):
        ctx[i, C - len(x):] = torch.from_numpy(x.astype(np.int64))
    ctx, pad = ctx.to(device), pad.to(device)
    with _autocast(device):
        cont = continue_fn(model, ctx, n_new, pad_left=pad if int(pad.max()) > 0 else None)
    out = torch.full((len(rows), seq_len), btok.ENDOFTEXT, dtype=torch.long, device=device)
    for i, x in enumerate(rows):
        out[i, : len(x)] = ctx[i, C - len(x):]
        out[i, len(x) : len(x) + n_new] = cont[i]
    return out, torch.tensor([len(x) for x in rows], device=device)


def _autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


# ---------------------------------------------------------------------------- stages


def train_target(r: Recipe, sampler: Sampler, device: torch.device, log: Callable[[str], None]) -> Target:
    torch.manual_seed(r.seed)
    target = Target(parse_target_config(target_config(r))).to(device)
    with torch.no_grad():
        for name, p in target.named_parameters():
            if p.dim() >= 2:
                torch.nn.init.normal_(p, std=0.02)
            if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                p.mul_(1.0 / math.sqrt(2 * r.layers))
    params = [p for p in target.parameters()]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=r.target_lr, betas=(0.9, 0.95), fused=device.type == "cuda")
    t0 = time.time()
    for step in range(r.target_steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, r.target_steps, r.target_lr, r.warmup_steps)
        batch = torch.from_numpy(sampler.windows(r.target_batch, r.seq_len + 1)).to(device)
        with _autocast(device):
            logits, _ = lm_forward(target, batch[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        optimizer_step(opt, params, loss)
        if step % 100 == 0 or step == r.target_steps - 1:
            log(f"target step {step:5d}/{r.target_steps} loss {loss.item():.4f} ({time.time() - t0:.0f}s)")
    return target.eval()


@torch.no_grad()
def distill_set(r: Recipe, target: Target, sampler: Sampler, device: torch.device,
                log: Callable[[str], None]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Contexts followed by the target's own greedy continuation.

    Returns (sequences [N, T] right-padded with <|endoftext|>, start of the greedy part [N],
    end of the valid part [N]). A `prompt_fraction` of contexts are chat prompts exactly as
    evaluation renders them (ending in the assistant header); the rest are corpus windows."""
    T, n_new = r.seq_len, r.distill_new_tokens
    max_ctx = T - n_new
    n_prompt = int(round(r.distill_contexts * r.prompt_fraction))
    prompts: list[np.ndarray] = []
    if not sampler.has_prompt(max_ctx):   # a corpus cut by --max-files may hold none that fits: random windows only
        n_prompt = 0
    while len(prompts) < n_prompt:
        p = sampler.prompt(max_ctx)
        if p is not None:
            prompts.append(p)
    prompts.sort(key=len)  # similar lengths share a batch: little padding
    batches: list[list[np.ndarray]] = [prompts[i : i + r.distill_batch] for i in range(0, len(prompts), r.distill_batch)]
    n_rand = r.distill_contexts - n_prompt
    while n_rand > 0:
        b = min(r.distill_batch, n_rand)
        batches.append(list(sampler.windows(b, int(sampler.rng.integers(32, max_ctx + 1)))))
        n_rand -= b
    seqs, starts, ends = [], [], []
    t0, done = time.time(), 0
    for rows in batches:
        out, lens = continue_rows(greedy_continue, target, rows, n_new, T, device)
        seqs.append(out)
        starts.append(lens)
        ends.append(lens + n_new)
        done += len(rows)
        log(f"distill {done}/{r.distill_contexts} contexts ({time.time() - t0:.0f}s)")
    return torch.cat(seqs), torch.cat(starts), torch.cat(ends)


def train_drafter(r: Recipe, target: Target, seqs: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
                  device: torch.device, log: Callable[[str], None]) -> DFlashDrafter:
    torch.manual_seed(r.seed + 1)
    dcfg = parse_draft_config(draft_config(r), target.cfg)
    drafter = DFlashDrafter(dcfg).to(device)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if p.dim() >= 2:
                torch.nn.init.normal_(p, std=0.02)
    for p in target.parameters():
        p.requires_grad_(False)
    params = list(drafter.parameters())
    opt = torch.optim.AdamW(params, lr=r.draft_lr, betas=(0.9, 0.95), weight_decay=0.0, fused=device.type == "cuda")
    bs, wdepth = r.block_size, depth_weights(r.block_size, r.depth_decay, device)
    gen = torch.Generator(device="cpu").manual_seed(r.seed + 2)
    N, T = seqs.shape
    t0 = time.time()
    for step in range(r.draft_steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, r.draft_steps, r.draft_lr, r.warmup_steps)
        rows = torch.randint(0, N, (r.draft_batch,), generator=gen).to(device)
        ids = seqs[rows]
        anchors = draft_anchors(starts[rows], ends[rows], bs, r.anchors_per_seq, gen, device)
        with torch.no_grad(), _autocast(device):
            _, feats = lm_forward(target, ids, hidden_layers=r.target_layer_ids)
        with _autocast(device):
            logits = draft_forward(drafter, target.model.embed_tokens, target.lm_head, feats, ids, anchors)  # [B, k, L, V]
        loss, labels = draft_loss(logits, ids, anchors, wdepth)
        optimizer_step(opt, params, loss)
        if step % 100 == 0 or step == r.draft_steps - 1:
            with torch.no_grad():
                acc = (logits.argmax(-1) == labels).float().mean(dim=(0, 1))
            log(f"draft step {step:5d}/{r.draft_steps} loss {loss.item():.4f} acc@1 {acc[0]:.3f} acc@8 {acc[7]:.3f} ({time.time() - t0:.0f}s)")
    return drafter.eval()


def save_pair(r: Recipe, target: Target, drafter: DFlashDrafter, out: Path, meta: dict[str, Any]) -> None:
    out = Path(out)
    tdir, ddir = out / "target", out / "draft"
    save_hf(target, target_config(r), tdir, dtype="bfloat16")
    btok.write_tokenizer(tdir)
    (tdir / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [btok.IM_END, btok.ENDOFTEXT], "pad_token_id": btok.ENDOFTEXT, "do_sample": False}, indent=2) + "\n")
    save_hf(drafter, draft_config(r), ddir, dtype="bfloat16")
    (out / "TRAINING.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")


def train(r: Recipe, out: Path, device: str = "cpu", log: Callable[[str], None] = print, data_dir: Path | None = None,
          max_files: int | None = None) -> dict[str, Any]:
    """Run all three stages and write the pair to `out`. Returns the training record (TRAINING.json)."""
    from ddtree_bench.env import environment, now_iso
    from ddtree_bench.toy.corpus import DATA_DIR, build_corpus

    dev = torch.device(device)
    torch.manual_seed(r.seed)
    t0 = time.time()
    corpus = build_corpus(data_dir or DATA_DIR, r.weights, max_files=max_files)
    log(f"corpus tokens: {corpus.describe()}  ({time.time() - t0:.0f}s)")
    sampler = Sampler(corpus, r.seed)
    t1 = time.time()
    target = train_target(r, sampler, dev, log)
    t2 = time.time()
    seqs, starts, ends = distill_set(r, target, sampler, dev, log)
    t3 = time.time()
    drafter = train_drafter(r, target, seqs, starts, ends, dev, log)
    t4 = time.time()
    meta = {
        "recipe": asdict(r),
        "corpus_tokens": corpus.describe(),
        "wall_s": {"corpus": t1 - t0, "target": t2 - t1, "distill": t3 - t2, "drafter": t4 - t3, "total": t4 - t0},
        "target_tokens_seen": r.target_steps * r.target_batch * r.seq_len,
        "device": device,
        "finished_at": now_iso(),
        "environment": environment(device),
    }
    save_pair(r, target, drafter, out, meta)
    log(f"wrote {out} in {t4 - t0:.0f}s")
    return meta
