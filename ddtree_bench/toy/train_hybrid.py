"""Training the bundled toy *hybrid* pair: a byte-level Qwen3.5-style target (Gated DeltaNet + gated
attention layers), then a DFlash drafter against it in the shape of z-lab's Qwen3.6 drafter.

The dense recipe's structure (toy/train.py), with what differs for a hybrid target:
* target: transformers' own `Qwen3_5ForCausalLM` (model_type `qwen3_5_text`; GDN layers and gated
  full-attention layers in a 3:1 pattern, partial RoPE, `(1+w)` norms), trained by next-token
  cross-entropy on windows of the same offline corpus (toy/corpus.py) and saved with `save_pretrained`,
  so `AutoModelForCausalLM.from_pretrained` loads the directory as it is. transformers is a
  training-only dependency here: the product's engine never imports it.
* distill: the trained target greedily continues contexts (chat prompts exactly as evaluation renders
  them, and corpus windows), batched and left-padded, through transformers' forward with its hybrid
  cache; padded rows give the same tokens as unpadded ones (tested).
* drafter: z-lab's DFlash layout (`DFlashDraftModel`, `fc`, `hidden_norm`, `layers.*`, `norm`) with
  `layer_types` = sliding-window layers then one full layer (z-lab's Qwen3.6-27B drafter is
  [S, S, S, S, F]); `target_layer_ids` span GDN and attention layers. Sliding layers are causal inside
  the block and see keys within `sliding_window` positions; the full layer sees the whole context and
  block (non-causal): exactly what the engine's `DFlashDrafter.layer_mask` does at inference (tested).
  Objective as in the dense recipe: blocks [anchor, mask x 15] at random anchors inside the greedy
  part, context features from the frozen target's hidden states (`hidden_states[i + 1]` = output of
  decoder layer i), depth-weighted cross-entropy through the target's embedding / lm_head.

`time_budget_s` fits the run into a wall-time budget: each training stage times the second half of
its warm-up (whose learning rates do not depend on the total; the first steps are slower, while
kernels and the allocator warm up) and caps its step count to its share of the budget at the last
warm-up step; distillation times its second batch; TRAINING.json records the counts that ran, so passing them back
(`--target-steps`, `--distill-contexts`, `--draft-steps`) reruns the same recipe without a budget.

Knows transformers' Qwen3.5 classes and the engine's drafter module; nothing of suites or HTTP beyond
the corpus module.
"""

from __future__ import annotations

import inspect
import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from ddtree_bench.engine.config import parse_draft_config
from ddtree_bench.engine.draft import DFlashDrafter
from ddtree_bench.engine.loading import save_hf
from ddtree_bench.errors import UsageError
from ddtree_bench.toy import tokenizer as btok
from ddtree_bench.toy.train import (Recipe, Sampler, _autocast, continue_rows, depth_weights, draft_anchors, draft_forward,
                                    draft_loss, lr_at, optimizer_step)

BUDGET_SHARES = {"target": 0.40, "distill": 0.15, "drafter": 0.45}  # of the time left after the corpus
SAVE_RESERVE_S = 15.0            # kept back from the budget for saving and the record
OVERRUN_FACTOR = 1.15            # a stage stops early once it is this far past its share
FEATURE_CACHE_FRACTION = 0.5     # precomputed target features may take up to this share of GPU memory
CPU_FEATURE_CACHE_BYTES = 2 ** 30  # ... and up to this much on a CPU


@dataclass
class HybridRecipe(Recipe):
    """Every knob of `ddtree-bench toy train --hybrid`; the defaults are the committed pair's recipe.

    Inherits the dense recipe's corpus, distillation and drafter-objective knobs (`Recipe`); the
    target's shape is a Qwen3.5 text model, the drafter's the z-lab Qwen3.6 layout."""

    # target (Qwen3_5ForCausalLM): `layers` with every `full_attention_interval`-th one full attention
    hidden: int = 256
    layers: int = 8
    full_attention_interval: int = 4
    heads: int = 4                    # gated attention: q_proj gives query and output gate per head
    kv_heads: int = 2
    head_dim: int = 64
    partial_rotary_factor: float = 0.25
    linear_key_heads: int = 4         # GDN
    linear_value_heads: int = 8
    linear_head_dim: int = 32
    conv_kernel: int = 4
    intermediate: int = 512
    # step counts of the committed pair (its run fitted them into a 275 s budget on one H200)
    target_steps: int = 478
    distill_contexts: int = 2048
    draft_steps: int = 791
    # drafter: sliding layers then one full layer
    draft_layers: int = 3
    draft_heads: int = 8
    draft_kv_heads: int = 4
    draft_intermediate: int = 384
    sliding_window: int = 256
    target_layer_ids: tuple[int, ...] = (1, 3, 5)   # GDN, attention, GDN
    # wall-time budget for the whole run (None: run the step counts as given)
    time_budget_s: float | None = None


def layer_types(r: HybridRecipe) -> list[str]:
    """Qwen3.5's pattern: layer i is full attention iff (i + 1) % interval == 0."""
    return ["full_attention" if (i + 1) % r.full_attention_interval == 0 else "linear_attention" for i in range(r.layers)]


def draft_layer_types(r: HybridRecipe) -> list[str]:
    return ["sliding_attention"] * (r.draft_layers - 1) + ["full_attention"]


def target_config(r: HybridRecipe) -> dict[str, Any]:
    """Keyword arguments of transformers' Qwen3_5TextConfig for the toy target."""
    return dict(
        vocab_size=btok.VOCAB_SIZE, hidden_size=r.hidden, intermediate_size=r.intermediate, num_hidden_layers=r.layers,
        layer_types=layer_types(r), num_attention_heads=r.heads, num_key_value_heads=r.kv_heads, head_dim=r.head_dim,
        linear_conv_kernel_dim=r.conv_kernel, linear_key_head_dim=r.linear_head_dim,
        linear_value_head_dim=r.linear_head_dim, linear_num_key_heads=r.linear_key_heads,
        linear_num_value_heads=r.linear_value_heads, hidden_act="silu", rms_norm_eps=1e-6,
        max_position_embeddings=4096, initializer_range=0.02, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=btok.IM_END, pad_token_id=btok.ENDOFTEXT,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": r.partial_rotary_factor},
    )


def draft_config(r: HybridRecipe) -> dict[str, Any]:
    """The drafter's config.json in z-lab's layout (the Qwen3.6-27B drafter's keys)."""
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "vocab_size": btok.VOCAB_SIZE,
        "hidden_size": r.hidden,
        "intermediate_size": r.draft_intermediate,
        "num_hidden_layers": r.draft_layers,
        "num_attention_heads": r.draft_heads,
        "num_key_value_heads": r.draft_kv_heads,
        "head_dim": r.hidden // r.draft_heads,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "block_size": r.block_size,
        "num_target_layers": r.layers,
        "layer_types": draft_layer_types(r),
        "sliding_window": r.sliding_window,
        "use_sliding_window": True,
        "dflash_config": {"mask_token_id": btok.MASK, "target_layer_ids": list(r.target_layer_ids)},
        "torch_dtype": "bfloat16",
    }


def require_transformers():
    """transformers' Qwen3.5 classes, or a UsageError saying to install them (exit 2, one line)."""
    try:
        from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    except ImportError as e:
        raise UsageError("`toy train --hybrid` needs transformers with Qwen3.5 support (a training-only dependency): "
                         f"pip install 'transformers>=5.2' ({e.__class__.__name__}: {e})") from None
    return Qwen3_5ForCausalLM, Qwen3_5TextConfig


def build_target(r: HybridRecipe):
    """A freshly initialised transformers Qwen3_5ForCausalLM (transformers' own init, residual outputs
    scaled by 1/sqrt(2 * layers) as in the dense recipe)."""
    Qwen3_5ForCausalLM, Qwen3_5TextConfig = require_transformers()
    torch.manual_seed(r.seed)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**target_config(r)))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
                p.mul_(1.0 / math.sqrt(2 * r.layers))
    return model


def build_drafter(r: HybridRecipe) -> DFlashDrafter:
    """The engine's drafter module for this recipe (its tensor names are z-lab's)."""
    stand_in = SimpleNamespace(vocab_size=btok.VOCAB_SIZE, hidden_size=r.hidden, num_hidden_layers=r.layers)
    return DFlashDrafter(parse_draft_config(draft_config(r), stand_in))


# ---------------------------------------------------------------------------- forwards


def _cache_kw(model) -> str:
    """transformers renamed `past_key_values` to `cache` (5.2x); use whichever this version takes."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def target_features(model, ids: torch.Tensor, layer_ids: tuple[int, ...]) -> torch.Tensor:
    """[B, T, n*H]: outputs of decoder layers `layer_ids` (transformers' hidden_states[i + 1])."""
    hs = model.model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
    return torch.cat([hs[i + 1] for i in layer_ids], dim=-1)


@torch.no_grad()
def greedy_continue(model, ctx: torch.Tensor, n_new: int, pad_left: torch.Tensor | None = None) -> torch.Tensor:
    """Batched greedy decoding through transformers' forward and hybrid cache, EOS ignored:
    ctx [B, C] (optionally left-padded by pad_left[b] slots) -> the next n_new tokens [B, n_new].

    Padding is masked out of attention and zeroed before each GDN layer (transformers does both from
    the 2-D attention mask), and positions start at each row's first real token."""
    B, C = ctx.shape
    dev = ctx.device
    mask = torch.ones(B, C, dtype=torch.long, device=dev)
    if pad_left is not None:
        mask = (torch.arange(C, device=dev)[None, :] >= pad_left[:, None]).long()
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    kw = _cache_kw(model)
    out = model(input_ids=ctx, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
    cache = out.cache if hasattr(out, "cache") and out.cache is not None else out.past_key_values
    nxt = out.logits[:, -1].argmax(-1)
    toks = [nxt]
    last = pos[:, -1]
    for step in range(1, n_new):
        mask = torch.cat([mask, torch.ones(B, 1, dtype=mask.dtype, device=dev)], 1)
        out = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=(last + step)[:, None], use_cache=True,
                    **{kw: cache})
        nxt = out.logits[:, -1].argmax(-1)
        toks.append(nxt)
    return torch.stack(toks, dim=1)


# ---------------------------------------------------------------------------- wall-time budget


class StageClock:
    """One stage's share of the wall-time budget: fixes the stage's step count from its measured speed
    (`calibrate`) and says when the stage has overrun its share (`overrun`). Without a budget both are
    no-ops and the planned count stands."""

    def __init__(self, budget_s: float | None, device: torch.device):
        self.budget_s = budget_s
        self.device = device
        self.t0 = time.time()
        self._mark: float | None = None

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def elapsed(self) -> float:
        return time.time() - self.t0

    def calibrate(self, step: int, planned: int, warmup: int) -> int | None:
        """Call after each step; returns the stage's total once, after the last warm-up step, from the
        time per step over the warm-up's second half: at least warmup + 1, at most `planned`."""
        if self.budget_s is None or warmup < 2:
            return None
        if step + 1 == warmup // 2:
            self._sync()
            self._mark = time.time()
        elif step + 1 == warmup and self._mark is not None:
            self._sync()
            per_step = (time.time() - self._mark) / (warmup - warmup // 2)
            fits = int((self.budget_s - self.elapsed()) / per_step) + step + 1
            return max(min(planned, warmup + 1), min(planned, fits))
        return None

    def per_item(self, items: int) -> float:
        """Seconds per item since `mark()` (distillation times its second batch this way)."""
        self._sync()
        return (time.time() - self._mark) / items

    def mark(self) -> None:
        self._sync()
        self._mark = time.time()

    def overrun(self) -> bool:
        return self.budget_s is not None and self.elapsed() > OVERRUN_FACTOR * self.budget_s


# ---------------------------------------------------------------------------- stages


def _adamw(params, lr: float, weight_decay: float, device: torch.device):
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), fused=device.type == "cuda")


def train_target(r: HybridRecipe, sampler: Sampler, device: torch.device, log: Callable[[str], None],
                 budget_s: float | None = None) -> tuple[Any, int]:
    """Next-token cross-entropy on corpus windows. Returns (model in eval mode, steps run)."""
    model = build_target(r).to(device)
    params = [p for p in model.parameters()]
    opt = _adamw(params, r.target_lr, 0.1, device)
    clock = StageClock(budget_s, device)
    total, step = r.target_steps, 0
    floor = min(r.target_steps, r.warmup_steps + 1)   # a stage cut for time still finishes its warm-up
    while step < total:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, r.target_lr, r.warmup_steps)
        batch = torch.from_numpy(sampler.windows(r.target_batch, r.seq_len + 1)).to(device)
        with _autocast(device):
            logits = model(input_ids=batch[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        optimizer_step(opt, params, loss)
        fixed = clock.calibrate(step, total, r.warmup_steps)
        if fixed is not None:
            log(f"target: {fixed} steps fit the budget of {budget_s:.0f}s")
            total = fixed
        if step % 100 == 0 or step == total - 1:
            log(f"target step {step:5d}/{total} loss {loss.item():.4f} ({clock.elapsed():.0f}s)")
        step += 1
        if clock.overrun() and step >= floor:
            log(f"target: stopped at step {step} (past the budget)")
            break
    return model.eval(), step


def _distill_batch(r: HybridRecipe, corpus, index: int) -> list[np.ndarray]:
    """Batch `index` of the distillation stream: a seeded mix of evaluation-shaped chat prompts
    (`prompt_fraction`) and corpus windows of random length. Depends only on (seed, index), so a run
    with fewer contexts is a prefix of one with more."""
    s = Sampler(corpus, r.seed * 1_000_003 + 7919 * (index + 1))
    max_ctx = r.seq_len - r.distill_new_tokens
    n_prompt = int(round(r.distill_batch * r.prompt_fraction))
    rows: list[np.ndarray] = []
    while len(rows) < n_prompt:
        p = s.prompt(max_ctx)
        if p is not None:
            rows.append(p)
    for _ in range(r.distill_batch - n_prompt):
        rows.append(s.windows(1, int(s.rng.integers(32, max_ctx + 1)))[0])
    return rows


@torch.no_grad()
def distill_set(r: HybridRecipe, model, corpus, device: torch.device, log: Callable[[str], None],
                budget_s: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Contexts followed by the target's own greedy continuation.

    Returns (sequences [N, T] right-padded with <|endoftext|>, start of the greedy part [N], end of
    the valid part [N], contexts made). With a budget, the second batch's time caps the batch count."""
    T, n_new = r.seq_len, r.distill_new_tokens
    n_batches = max(1, math.ceil(r.distill_contexts / r.distill_batch))
    clock = StageClock(budget_s, device)
    seqs, starts, ends = [], [], []
    done, i = 0, 0
    while i < n_batches:
        rows = _distill_batch(r, corpus, i)[: r.distill_contexts - done]
        out, lens = continue_rows(greedy_continue, model, rows, n_new, T, device)
        seqs.append(out)
        starts.append(lens)
        ends.append(lens + n_new)
        done += len(rows)
        i += 1
        if budget_s is not None and i == 1:
            clock.mark()
        elif budget_s is not None and i == 2:   # the second batch: the first one pays for warming up
            fits = max(2, 2 + int((budget_s - clock.elapsed()) / clock.per_item(1)))
            if fits < n_batches:
                log(f"distill: {fits} batches fit the budget of {budget_s:.0f}s")
                n_batches = fits
        log(f"distill {done} contexts ({clock.elapsed():.0f}s)")
        if clock.overrun():
            log(f"distill: stopped at {done} contexts (past the budget)")
            break
    return torch.cat(seqs), torch.cat(starts), torch.cat(ends), done


@torch.no_grad()
def precompute_features(r: HybridRecipe, model, seqs: torch.Tensor, ends: torch.Tensor,
                        device: torch.device) -> torch.Tensor | None:
    """The frozen target's features for every distilled sequence, once ([N, T, n*H] in the autocast
    dtype), so drafter steps skip the target forward; None when they would not fit in
    FEATURE_CACHE_FRACTION of the GPU's memory (CPU_FEATURE_CACHE_BYTES on a CPU): steps then run the
    target themselves."""
    N, T = seqs.shape
    width = len(r.target_layer_ids) * r.hidden
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    need = N * T * width * torch.finfo(dtype).bits // 8
    room = (FEATURE_CACHE_FRACTION * torch.cuda.get_device_properties(device).total_memory if device.type == "cuda"
            else CPU_FEATURE_CACHE_BYTES)
    if need > room:
        return None
    out = torch.zeros(N, T, width, dtype=dtype, device=device)
    for i in range(0, N, r.draft_batch):
        Te = int(ends[i: i + r.draft_batch].max())
        with _autocast(device):
            out[i: i + r.draft_batch, :Te] = target_features(model, seqs[i: i + r.draft_batch, :Te], r.target_layer_ids).to(dtype)
    return out


def train_drafter(r: HybridRecipe, model, seqs: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
                  device: torch.device, log: Callable[[str], None],
                  budget_s: float | None = None) -> tuple[DFlashDrafter, int]:
    """The DFlash objective against the frozen target. Returns (drafter in eval mode, steps run)."""
    torch.manual_seed(r.seed + 1)
    drafter = build_drafter(r).to(device)
    with torch.no_grad():
        for p in drafter.parameters():
            if p.dim() >= 2:
                torch.nn.init.normal_(p, std=0.02)
    for p in model.parameters():
        p.requires_grad_(False)
    embed, lm_head = model.model.embed_tokens, model.lm_head
    params = list(drafter.parameters())
    opt = torch.optim.AdamW(params, lr=r.draft_lr, betas=(0.9, 0.95), weight_decay=0.0, fused=device.type == "cuda")
    bs, wdepth = r.block_size, depth_weights(r.block_size, r.depth_decay, device)
    gen = torch.Generator(device="cpu").manual_seed(r.seed + 2)
    N = seqs.shape[0]
    clock = StageClock(budget_s, device)
    feats_all = precompute_features(r, model, seqs, ends, device)
    if feats_all is not None:
        log(f"drafter: target features of {N} sequences precomputed ({clock.elapsed():.0f}s)")
    total, step = r.draft_steps, 0
    floor = min(r.draft_steps, r.warmup_steps + 1)
    while step < total:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, r.draft_lr, r.warmup_steps)
        rows = torch.randint(0, N, (r.draft_batch,), generator=gen).to(device)
        T = int(ends[rows].max())
        ids = seqs[rows, :T]
        anchors = draft_anchors(starts[rows], ends[rows], bs, r.anchors_per_seq, gen, device)
        if feats_all is not None:
            feats = feats_all[rows, :T]
        else:
            with torch.no_grad(), _autocast(device):
                feats = target_features(model, ids, r.target_layer_ids)
        with _autocast(device):
            logits = draft_forward(drafter, embed, lm_head, feats, ids, anchors)   # [B, k, L, V]
        loss, labels = draft_loss(logits, ids, anchors, wdepth)
        optimizer_step(opt, params, loss)
        fixed = clock.calibrate(step, total, r.warmup_steps)
        if fixed is not None:
            log(f"drafter: {fixed} steps fit the budget of {budget_s:.0f}s")
            total = fixed
        if step % 100 == 0 or step == total - 1:
            with torch.no_grad():
                acc = (logits.argmax(-1) == labels).float().mean(dim=(0, 1))
            log(f"draft step {step:5d}/{total} loss {loss.item():.4f} acc@1 {acc[0]:.3f} acc@8 {acc[7]:.3f} ({clock.elapsed():.0f}s)")
        step += 1
        if clock.overrun() and step >= floor:
            log(f"drafter: stopped at step {step} (past the budget)")
            break
    return drafter.eval(), step


def save_pair(r: HybridRecipe, model, drafter: DFlashDrafter, out: Path, meta: dict[str, Any]) -> None:
    """target/ by transformers' save_pretrained (bf16) + the toy tokenizer; draft/ in z-lab's layout."""
    out = Path(out)
    tdir, ddir = out / "target", out / "draft"
    model.to(torch.bfloat16).save_pretrained(tdir)
    btok.write_tokenizer(tdir)
    (tdir / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [btok.IM_END, btok.ENDOFTEXT], "pad_token_id": btok.ENDOFTEXT, "do_sample": False}, indent=2) + "\n")
    save_hf(drafter, draft_config(r), ddir, dtype="bfloat16")
    (out / "TRAINING.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")


def train(r: HybridRecipe, out: Path, device: str = "cpu", log: Callable[[str], None] = print,
          data_dir: Path | None = None, max_files: int | None = None) -> dict[str, Any]:
    """Run all three stages and write the pair to `out`. Returns the training record (TRAINING.json)."""
    from ddtree_bench.env import environment, now_iso
    from ddtree_bench.toy.corpus import DATA_DIR, build_corpus

    require_transformers()
    dev = torch.device(device)
    torch.manual_seed(r.seed)
    t0 = time.time()
    corpus = build_corpus(data_dir or DATA_DIR, r.weights, max_files=max_files)
    log(f"corpus tokens: {corpus.describe()}  ({time.time() - t0:.0f}s)")
    sampler = Sampler(corpus, r.seed)
    t1 = time.time()
    shares = None
    if r.time_budget_s is not None:
        left = r.time_budget_s - (t1 - t0) - SAVE_RESERVE_S
        shares = {k: v * left for k, v in BUDGET_SHARES.items()}
    target, target_steps = train_target(r, sampler, dev, log, shares and shares["target"])
    t2 = time.time()
    distill_budget = None
    if shares is not None:  # distillation and drafter share what the target left
        left = r.time_budget_s - (t2 - t0) - SAVE_RESERVE_S
        distill_budget = left * BUDGET_SHARES["distill"] / (BUDGET_SHARES["distill"] + BUDGET_SHARES["drafter"])
    seqs, starts, ends, contexts = distill_set(r, target, corpus, dev, log, distill_budget)
    t3 = time.time()
    draft_budget = None if shares is None else r.time_budget_s - (t3 - t0) - SAVE_RESERVE_S
    drafter, draft_steps = train_drafter(r, target, seqs, starts, ends, dev, log, draft_budget)
    t4 = time.time()
    ran = replace(r, target_steps=target_steps, distill_contexts=contexts, draft_steps=draft_steps)
    meta = {
        "recipe": asdict(ran),
        "planned": {"target_steps": r.target_steps, "distill_contexts": r.distill_contexts, "draft_steps": r.draft_steps},
        "target_layer_types": layer_types(r),
        "draft_layer_types": draft_layer_types(r),
        "corpus_tokens": corpus.describe(),
        "wall_s": {"corpus": t1 - t0, "target": t2 - t1, "distill": t3 - t2, "drafter": t4 - t3, "total": t4 - t0},
        "target_tokens_seen": target_steps * r.target_batch * r.seq_len,
        "parameters": {"target": sum(p.numel() for p in target.parameters()),
                       "draft": sum(p.numel() for p in drafter.parameters())},
        "device": device,
        "finished_at": now_iso(),
        "environment": environment(device),
    }
    save_pair(ran, target, drafter, out, meta)
    log(f"wrote {out} in {time.time() - t0:.0f}s")
    return meta
