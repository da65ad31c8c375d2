"""Loading targets and drafters from Hugging Face directories, and the seeded random tiny pair.

A model directory holds `config.json` and `model.safetensors` or a sharded
`model.safetensors.index.json` (+ shards). Weights are cast to the requested dtype on load; tied
embeddings (`tie_word_embeddings`) need no `lm_head.weight`. Everything that can be wrong with a
directory (missing, malformed config, corrupt or truncated safetensors, missing or misshapen
tensors, a drafter that does not fit its target) raises `UsageError` with one clear sentence.

Knows nothing of tokenizers, suites or HTTP.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ddtree_bench.engine.config import (
    TargetConfig,
    parse_draft_config,
    parse_target_config,
)
from ddtree_bench.engine.checkpoint import load_into as _load_into, read_state_dict, weight_files  # noqa: F401
from ddtree_bench.engine.draft import DFlashDrafter
from ddtree_bench.engine.model import Target
from ddtree_bench.errors import UsageError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_HASH_FULL_LIMIT = 1 << 30  # files above 1 GiB are hashed by header + size + sampled blocks


def torch_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise UsageError(f"unknown dtype {name!r}; expected one of {', '.join(DTYPES)}")
    return DTYPES[name]


def resolve_device(name: str) -> torch.device:
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name}: CUDA is not available on this machine", hint="use --device cpu")
    return dev


def read_config(model_dir: Path, what: str) -> dict[str, Any]:
    model_dir = Path(model_dir)
    if not model_dir.exists():
        raise UsageError(f"{what} directory {model_dir} does not exist")
    if not model_dir.is_dir():
        raise UsageError(f"{what} path {model_dir} is not a directory")
    cfg_path = model_dir / "config.json"
    if not cfg_path.exists():
        raise UsageError(f"{what} directory {model_dir} has no config.json")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{cfg_path}: malformed JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise UsageError(f"{cfg_path}: expected a JSON object")
    return cfg


def check_configs(target_dir: Path, draft_dir: Path | None = None) -> None:
    """What `load_target` / `load_drafter` check before any weight is read: the target's config parses (dense or
    hybrid) and the drafter's fits it (target_layer_ids in range, ...). UsageError naming the file otherwise;
    a sweep calls it for every pair before its first point."""
    from ddtree_bench.engine.hybrid.config import is_hybrid_config, parse_hybrid_config

    what = f"model {target_dir}"
    raw = read_config(target_dir, "model")
    cfg = parse_hybrid_config(raw, what) if is_hybrid_config(raw) else parse_target_config(raw, what)
    if draft_dir is not None:
        parse_draft_config(read_config(draft_dir, "draft"), cfg, f"draft {draft_dir}")


def load_target(model_dir: Path, dtype: str = "float32", device: str = "cpu", target_variant=None) -> Target:
    """A target from a HF directory. Hybrid / MoE model types (engine/hybrid/) load as `HybridTarget`;
    `target_variant` (a name or a target_variants.TargetVariant) runs it under a target-side variant."""
    what = f"model {model_dir}"
    raw = read_config(model_dir, "model")
    from ddtree_bench.engine.hybrid.config import is_hybrid_config

    if is_hybrid_config(raw):
        from ddtree_bench.engine.hybrid.loading import load_hybrid_target

        return load_hybrid_target(model_dir, raw, torch_dtype(dtype), resolve_device(device), what, target_variant)
    if target_variant not in (None, "", "reference") and getattr(target_variant, "name", "reference") != "reference":
        from ddtree_bench.engine.target_variants import parse_target_variant

        v = parse_target_variant(target_variant) if isinstance(target_variant, str) else target_variant
        raise UsageError(f"target variant {v.name!r} applies to hybrid (Gated DeltaNet) targets only; {model_dir} is {raw.get('model_type')!r}")
    cfg = parse_target_config(raw, what)
    sd = read_state_dict(model_dir, what)
    target = Target(cfg)
    tied = ("lm_head.weight",) if cfg.tie_word_embeddings else ()
    _load_into(target, sd, what, ignore_missing=tied)
    if cfg.tie_word_embeddings:
        target.lm_head.weight = target.model.embed_tokens.weight
    return target.to(device=resolve_device(device), dtype=torch_dtype(dtype)).eval()


def load_drafter(draft_dir: Path, target_cfg: TargetConfig, dtype: str = "float32", device: str = "cpu") -> DFlashDrafter:
    what = f"draft {draft_dir}"
    cfg = parse_draft_config(read_config(draft_dir, "draft"), target_cfg, what)
    sd = read_state_dict(draft_dir, what)
    if any(k.startswith("model.") for k in sd):  # some exports prefix the drafter's tensors
        sd = {k.removeprefix("model."): v for k, v in sd.items()}
    drafter = DFlashDrafter(cfg)
    _load_into(drafter, sd, what)
    return drafter.to(device=resolve_device(device), dtype=torch_dtype(dtype)).eval()


def file_hash(path: Path) -> str:
    """sha256 of a file; files over 1 GiB hash their size, first and last MiB ("sha256-sampled:")."""
    path = Path(path)
    h = hashlib.sha256()
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size <= _HASH_FULL_LIMIT:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
            return "sha256:" + h.hexdigest()
        h.update(str(size).encode())
        h.update(f.read(1 << 20))
        f.seek(size - (1 << 20))
        h.update(f.read(1 << 20))
    return "sha256-sampled:" + h.hexdigest()


def dir_hash(model_dir: Path) -> str:
    """One hash over config.json and the weight files of a model directory."""
    model_dir = Path(model_dir)
    h = hashlib.sha256()
    files = [model_dir / "config.json"] + weight_files(model_dir, str(model_dir))
    for f in files:
        h.update(f.name.encode())
        h.update(file_hash(f).encode())
    return "sha256:" + h.hexdigest()[:32]


# ---------------------------------------------------------------------------- random tiny pair


def random_configs(vocab_size: int = 64, layers: int = 4, draft_layers: int = 2, hidden: int = 64, seed: int = 0,
                   model_type: str = "qwen3", block_size: int = 16) -> tuple[dict, dict]:
    """HF-style config dicts of a tiny target and a DFlash drafter (for tests and `--model random`)."""
    target = {
        "architectures": ["Qwen3ForCausalLM" if model_type == "qwen3" else "LlamaForCausalLM"],
        "model_type": model_type,
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": hidden * 2,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": hidden // 4,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "max_position_embeddings": 4096,
        "hidden_act": "silu",
    }
    draft = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": hidden * 2,
        "num_hidden_layers": draft_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": hidden // 4,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "block_size": block_size,
        "num_target_layers": layers,
        "dflash_config": {"mask_token_id": vocab_size - 1, "target_layer_ids": [1, layers - 2]},
    }
    return target, draft


def random_pair(seed: int = 0, dtype: str = "float32", device: str = "cpu", **kw) -> tuple[Target, DFlashDrafter]:
    """A seeded random tiny target + drafter built in memory. Its drafter accepts almost nothing:
    good for losslessness tests, useless for acceptance figures."""
    tcfg_d, dcfg_d = random_configs(seed=seed, **kw)
    tcfg = parse_target_config(tcfg_d)
    dcfg = parse_draft_config(dcfg_d, tcfg)
    g = torch.Generator().manual_seed(seed)
    target, drafter = Target(tcfg), DFlashDrafter(dcfg)
    for m in (target, drafter):
        for name, p in m.named_parameters():
            with torch.no_grad():
                if name.endswith("norm.weight"):
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * (1.0 / p.shape[-1] ** 0.5))
    return (target.to(device=resolve_device(device), dtype=torch_dtype(dtype)).eval(),
            drafter.to(device=resolve_device(device), dtype=torch_dtype(dtype)).eval())


def save_hf(module: nn.Module, cfg: dict[str, Any], out_dir: Path, dtype: str | None = None, shards: int = 1) -> None:
    """Write a module as a Hugging Face directory (config.json + safetensors, optionally sharded)."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().contiguous().clone() for k, v in module.state_dict().items()}
    if cfg.get("tie_word_embeddings"):
        sd.pop("lm_head.weight", None)
    if dtype is not None:
        sd = {k: v.to(torch_dtype(dtype)) for k, v in sd.items()}
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    if shards <= 1:
        save_file(sd, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        return
    keys = sorted(sd)
    weight_map = {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: sd[k] for k in keys[s::shards]}
        save_file(part, str(out_dir / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in part})
    (out_dir / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2))
