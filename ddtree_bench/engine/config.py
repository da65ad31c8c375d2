"""Model configurations read from Hugging Face `config.json` dicts, validated with clear errors.

`TargetConfig` covers Qwen3 dense (q/k RMSNorm) and Llama-3.x (no q/k norm, optional biases,
llama3 RoPE scaling). `DraftConfig` covers z-lab's DFlash drafter format: `block_size` at top level
or in `dflash_config`, `dflash_config.mask_token_id`, `dflash_config.target_layer_ids` (default rule
when absent), `layer_types` / `sliding_window` / `is_causal`. Knows nothing of weights or files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddtree_bench.errors import UsageError

SUPPORTED_TARGETS = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    kind: str = "default"            # default | linear | llama3
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class TargetConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    tie_word_embeddings: bool
    qk_norm: bool                    # Qwen3: RMSNorm on q and k per head; Llama: none
    attention_bias: bool = False
    mlp_bias: bool = False
    max_position_embeddings: int = 32768


@dataclass(frozen=True)
class DraftConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    layer_causal: tuple[bool, ...]               # per layer: causal inside the block?
    layer_window: tuple[int | None, ...]         # per layer: sliding window (None = full)
    attention_bias: bool = False
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


def _int(cfg: dict[str, Any], key: str, where: str, default: int | None = None, minimum: int = 1) -> int:
    """An integer field (required when default is None), checked to be an integer >= minimum."""
    v = cfg.get(key)
    if v is None:
        if default is None:
            raise UsageError(f"{where}: config.json has no {key!r}")
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v or v < minimum:
        raise UsageError(f"{where}: config.json {key} must be an integer >= {minimum}, got {v!r}")
    return int(v)


def _float(cfg: dict[str, Any], key: str, where: str, default: float) -> float:
    v = cfg.get(key)
    v = default if v is None else v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise UsageError(f"{where}: config.json {key} must be a positive number, got {v!r}")
    return float(v)


def _first(*values: Any) -> Any:
    """The first value that is not None (a key present but null counts as absent)."""
    return next((v for v in values if v is not None), None)


def parse_rope(cfg: dict[str, Any]) -> RopeConfig:
    """Read RoPE settings from either spelling: transformers<5 (`rope_theta`, `rope_scaling`) or 5.x (`rope_parameters`)."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    if not isinstance(params, dict) or not isinstance(scaling, dict):
        raise UsageError(f"RoPE settings must be objects, got rope_parameters={params!r}, rope_scaling={scaling!r}")
    try:
        return _parse_rope(cfg, params, scaling)
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"RoPE settings {scaling or params!r} are malformed ({type(e).__name__}: {e})") from None


def _parse_rope(cfg: dict[str, Any], params: dict[str, Any], scaling: dict[str, Any]) -> RopeConfig:
    if isinstance(params, dict) and "rope_type" in params and params.get("rope_type") != "default":
        scaling = params
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default")) or "default"
    if kind == "default":
        return RopeConfig(theta=theta)
    if kind == "linear":
        return RopeConfig(theta=theta, kind="linear", factor=float(scaling["factor"]))
    if kind == "llama3":
        return RopeConfig(
            theta=theta,
            kind="llama3",
            factor=float(scaling["factor"]),
            low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
            high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(scaling.get("original_max_position_embeddings", 8192)),
        )
    raise UsageError(f"RoPE scaling {kind!r} is not supported by the reference engine (supported: default, linear, llama3)")


def parse_target_config(cfg: dict[str, Any], where: str = "target") -> TargetConfig:
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_TARGETS:
        archs = cfg.get("architectures")
        raise UsageError(
            f"{where}: model_type {model_type!r} ({archs}) is not supported; the reference engine runs "
            f"dense Qwen3 and Llama-3.x targets, the hybrid Qwen3.5 / Qwen3-Next families and Qwen3-MoE "
            f"(model_type qwen3, llama, qwen3_5_text, qwen3_5, qwen3_5_moe, qwen3_next, qwen3_moe)"
        )
    if cfg.get("use_sliding_window"):
        raise UsageError(f"{where}: sliding-window targets are not supported by the reference engine")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise UsageError(f"{where}: hidden_act {act!r} is not supported (silu only)")
    hidden = _int(cfg, "hidden_size", where)
    heads = _int(cfg, "num_attention_heads", where)
    head_dim = _int(cfg, "head_dim", where, default=hidden // heads)
    return TargetConfig(
        model_type=model_type,
        vocab_size=_int(cfg, "vocab_size", where),
        hidden_size=hidden,
        intermediate_size=_int(cfg, "intermediate_size", where),
        num_hidden_layers=_int(cfg, "num_hidden_layers", where),
        num_attention_heads=heads,
        num_key_value_heads=_int(cfg, "num_key_value_heads", where, default=heads),
        head_dim=head_dim,
        rms_norm_eps=_float(cfg, "rms_norm_eps", where, 1e-6),
        rope=parse_rope(cfg),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qk_norm=model_type == "qwen3",
        attention_bias=bool(cfg.get("attention_bias", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        max_position_embeddings=_int(cfg, "max_position_embeddings", where, default=32768),
    )


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's rule: one draft layer -> [N // 2]; else evenly spaced, rounded, from layer 1 to N - 3."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(round(start + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def parse_draft_config(cfg: dict[str, Any], target: TargetConfig, where: str = "draft") -> DraftConfig:
    """Parse and validate a z-lab DFlash drafter config against its target."""
    dflash = cfg.get("dflash_config") or {}
    if not isinstance(dflash, dict):
        raise UsageError(f"{where}: dflash_config must be an object")
    block_size = _first(cfg.get("block_size"), dflash.get("block_size"))
    if block_size is None:
        raise UsageError(f"{where}: no block_size (top level or dflash_config.block_size)")
    block_size = _int({"block_size": block_size}, "block_size", where, minimum=-2**31)
    if block_size < 2:
        raise UsageError(f"{where}: block_size must be >= 2, got {block_size}")
    mask = _first(dflash.get("mask_token_id"), cfg.get("mask_token_id"))
    if mask is None:
        raise UsageError(f"{where}: no dflash_config.mask_token_id")
    mask = _int({"mask_token_id": mask}, "mask_token_id", where, minimum=-2**31)
    if not 0 <= mask < target.vocab_size:
        raise UsageError(f"{where}: mask_token_id {mask} is outside the target vocabulary (size {target.vocab_size})")
    n_layers = _int(cfg, "num_hidden_layers", where)
    layer_ids = _first(dflash.get("target_layer_ids"), cfg.get("target_layer_ids"))
    if layer_ids is None:
        n_target = _int(cfg, "num_target_layers", where, default=target.num_hidden_layers)
        layer_ids = default_target_layer_ids(n_target, n_layers)
    if not isinstance(layer_ids, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in layer_ids):
        raise UsageError(f"{where}: target_layer_ids must be a list of integers, got {layer_ids!r}")
    layer_ids = tuple(int(i) for i in layer_ids)
    if not layer_ids:
        raise UsageError(f"{where}: target_layer_ids is empty")
    bad = [i for i in layer_ids if not 0 <= i < target.num_hidden_layers]
    if bad:
        raise UsageError(
            f"{where}: target_layer_ids {list(layer_ids)} has {bad} outside the target's "
            f"{target.num_hidden_layers} layers (0-based)"
        )
    hidden = _int(cfg, "hidden_size", where)
    if hidden != target.hidden_size:
        raise UsageError(f"{where}: hidden_size {hidden} differs from the target's {target.hidden_size}")
    heads = _int(cfg, "num_attention_heads", where)
    types = cfg.get("layer_types") or ["full_attention"] * n_layers
    if len(types) != n_layers:
        raise UsageError(f"{where}: layer_types has {len(types)} entries for {n_layers} layers")
    window = cfg.get("sliding_window")
    causal, windows = [], []
    for t in types:
        sliding = t == "sliding_attention"
        if sliding and not window:
            raise UsageError(f"{where}: layer_types has sliding_attention but sliding_window is not set")
        causal.append(bool(cfg["is_causal"]) if "is_causal" in cfg else sliding)
        windows.append(_int(cfg, "sliding_window", where) if sliding else None)
    return DraftConfig(
        hidden_size=hidden,
        intermediate_size=_int(cfg, "intermediate_size", where),
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        num_key_value_heads=_int(cfg, "num_key_value_heads", where, default=heads),
        head_dim=_int(cfg, "head_dim", where, default=hidden // heads),
        rms_norm_eps=_float(cfg, "rms_norm_eps", where, 1e-6),
        rope=parse_rope(cfg),
        block_size=block_size,
        mask_token_id=mask,
        target_layer_ids=layer_ids,
        layer_causal=tuple(causal),
        layer_window=tuple(windows),
        attention_bias=bool(cfg.get("attention_bias", False)),
        raw=cfg,
    )
