"""Loading a hybrid / MoE target from a Hugging Face directory (config.json + safetensors).

Tensor names are mapped onto `HybridTarget`'s (= Hugging Face's causal-LM names):
* conditional-generation checkpoints (`qwen3_5`, `qwen3_5_moe`): `model.language_model.*` -> `model.*`;
  the vision tower (`model.visual.*`) and multi-token-prediction heads (`mtp.*`) are not loaded;
* fused expert tensors (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I], the
  layout transformers 5 uses in memory) -> per-expert `mlp.experts.{e}.{gate,up,down}_proj.weight`.
Validation (missing / misshapen / quantized / non-finite tensors) is the engine's `checkpoint.load_into`.
Knows nothing of tokenizers or generation.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ddtree_bench.engine.hybrid.config import parse_hybrid_config
from ddtree_bench.engine.hybrid.model import HybridTarget

DROPPED_PREFIXES = ("model.visual.", "visual.", "mtp.", "model.mtp.")


def remap(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        if k.startswith(DROPPED_PREFIXES):
            continue
        if k.startswith("model.language_model."):
            k = "model." + k.removeprefix("model.language_model.")
        elif k.startswith("language_model.model."):
            k = "model." + k.removeprefix("language_model.model.")
        elif k.startswith("language_model.lm_head."):
            k = k.removeprefix("language_model.")
        if k.endswith("mlp.experts.gate_up_proj"):
            base = k.removesuffix("gate_up_proj")
            inter = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = v[e, :inter]
                out[f"{base}{e}.up_proj.weight"] = v[e, inter:]
            continue
        if k.endswith("mlp.experts.down_proj"):
            base = k.removesuffix("down_proj")
            for e in range(v.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = v[e]
            continue
        out[k] = v
    return out


def load_hybrid_target(model_dir: Path, cfg: dict, dtype: torch.dtype, device: torch.device, what: str,
                       target_variant=None) -> HybridTarget:
    from ddtree_bench.engine.checkpoint import load_into, read_state_dict
    from ddtree_bench.engine.target_variants import apply_target_variant, parse_target_variant

    hcfg = parse_hybrid_config(cfg, what)
    sd = remap(read_state_dict(model_dir, what))
    target = HybridTarget(hcfg)
    tied = ("lm_head.weight",) if hcfg.tie_word_embeddings else ()
    load_into(target, sd, what, ignore_missing=tied)
    if hcfg.tie_word_embeddings:
        target.lm_head.weight = target.model.embed_tokens.weight
    variant = target_variant if not isinstance(target_variant, (str, type(None))) else parse_target_variant(target_variant)
    apply_target_variant(target, variant)
    return target.to(device=device, dtype=dtype).eval()
