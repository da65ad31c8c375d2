"""Hybrid and MoE target configurations: Hugging Face `config.json` dicts of the Qwen3.5 / Qwen3-Next family.

Model types read here (everything else is `engine/config.py`'s business, or refused there):

| model_type | layout |
|---|---|
| `qwen3_5_text` | Gated DeltaNet (GDN) + gated attention, dense MLP |
| `qwen3_5` | the same text model inside a conditional-generation config (`text_config`; vision ignored) |
| `qwen3_5_moe_text` / `qwen3_5_moe` | GDN + gated attention, every MLP a routed MoE with a gated shared expert |
| `qwen3_next` | GDN with packed `in_proj_qkvz` / `in_proj_ba`, MoE (shared expert) except `mlp_only_layers` |
| `qwen3_moe` | plain Qwen3 attention (q/k norm, full rotary, plain RMSNorm), MoE except `mlp_only_layers` |

Facts kept: per-layer `layer_types` (default: every 4th layer full attention), GDN head counts and
dims, the conv kernel width K, `mamba_ssm_dtype` (the recurrent state's dtype; float32 when absent),
the rotary fraction (`partial_rotary_factor`, 0.25 by default for the GDN families), MoE routing.
Anything the engine cannot run raises `UsageError` naming it. Knows nothing of weights or tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddtree_bench.engine.config import RopeConfig, _float, _int, parse_rope
from ddtree_bench.errors import UsageError

GDN_TYPES = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")
WRAPPED = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}   # conditional generation -> text part
HYBRID_TYPES = GDN_TYPES + tuple(WRAPPED) + ("qwen3_moe",)
LAYER_KINDS = ("linear_attention", "full_attention")
SSM_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int
    top_k: int
    intermediate_size: int
    norm_topk_prob: bool
    shared_intermediate_size: int     # 0 = no shared expert
    moe_layers: tuple[bool, ...]      # per layer: routed MoE (True) or the dense MLP


@dataclass(frozen=True)
class HybridConfig:
    model_type: str                   # the text model's type (qwen3_5_text, qwen3_5_moe_text, qwen3_next, qwen3_moe)
    vocab_size: int
    hidden_size: int
    intermediate_size: int            # dense MLP width (0 when every layer is MoE)
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    rotary_dim: int                   # the first rotary_dim dims of each head are rotated
    tie_word_embeddings: bool
    layer_types: tuple[str, ...]      # "linear_attention" (GDN) | "full_attention"
    gated_attention: bool             # q_proj gives query and an output gate per head
    zero_centred_norms: bool          # RMSNorm weight applied as (1 + w)
    packed_gdn: bool                  # Qwen3-Next: in_proj_qkvz / in_proj_ba grouped per key head
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    conv_kernel: int = 4
    ssm_dtype: str = "float32"
    moe: MoEConfig | None = None
    max_position_embeddings: int = 32768
    wrapped: bool = False             # weights under model.language_model.* (conditional generation)
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def gdn_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")

    @property
    def conv_dim(self) -> int:
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def is_hybrid(self) -> bool:
        """True when some layer is recurrent (GDN): the tree verify then needs per-node states."""
        return bool(self.gdn_layers)


def is_hybrid_config(cfg: dict[str, Any]) -> bool:
    return cfg.get("model_type") in HYBRID_TYPES


def _text_part(cfg: dict[str, Any], where: str) -> tuple[dict[str, Any], bool]:
    mt = cfg.get("model_type")
    if mt not in WRAPPED:
        return cfg, False
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise UsageError(f"{where}: model_type {mt!r} needs a text_config object")
    text = dict(text)
    text.setdefault("model_type", WRAPPED[mt])
    if "tie_word_embeddings" in cfg and "tie_word_embeddings" not in text:
        text["tie_word_embeddings"] = cfg["tie_word_embeddings"]
    return text, True


def parse_hybrid_config(cfg: dict[str, Any], where: str = "target") -> HybridConfig:
    """Parse and validate one of HYBRID_TYPES (UsageError naming what is missing or unsupported)."""
    text, wrapped = _text_part(cfg, where)
    mt = text.get("model_type")
    if mt not in GDN_TYPES + ("qwen3_moe",):
        raise UsageError(f"{where}: text model_type {mt!r} is not supported (expected one of {', '.join(GDN_TYPES + ('qwen3_moe',))})")
    act = text.get("hidden_act", "silu")
    if act != "silu":
        raise UsageError(f"{where}: hidden_act {act!r} is not supported (silu only)")
    if text.get("use_sliding_window"):
        raise UsageError(f"{where}: sliding-window targets are not supported by the reference engine")
    if text.get("attention_bias"):
        raise UsageError(f"{where}: attention_bias is not supported for {mt} targets")
    n = _int(text, "num_hidden_layers", where)
    hidden = _int(text, "hidden_size", where)
    heads = _int(text, "num_attention_heads", where)
    head_dim = _int(text, "head_dim", where, default=hidden // heads)
    gdn_family = mt in GDN_TYPES
    if gdn_family:
        interval = _int(text, "full_attention_interval", where, default=4)
        types = text.get("layer_types") or ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    else:
        types = ["full_attention"] * n
    if not isinstance(types, list) or len(types) != n or any(t not in LAYER_KINDS for t in types):
        raise UsageError(f"{where}: layer_types must list {n} entries of {LAYER_KINDS}, got {types!r}")
    params = text.get("rope_parameters") or {}
    factor = params.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25 if gdn_family else 1.0))
    if not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise UsageError(f"{where}: partial_rotary_factor must be in (0, 1], got {factor!r}")
    rotary_dim = int(head_dim * factor)
    if rotary_dim % 2:
        raise UsageError(f"{where}: rotary dimension {rotary_dim} (head_dim x partial_rotary_factor) must be even")
    ssm = text.get("mamba_ssm_dtype") or "float32"
    if ssm not in SSM_DTYPES:
        raise UsageError(f"{where}: mamba_ssm_dtype {ssm!r} is not supported (expected one of {', '.join(SSM_DTYPES)})")
    moe = _parse_moe(text, mt, n, where)
    gdn = {}
    if gdn_family:
        gdn = dict(
            linear_num_key_heads=_int(text, "linear_num_key_heads", where),
            linear_num_value_heads=_int(text, "linear_num_value_heads", where),
            linear_key_head_dim=_int(text, "linear_key_head_dim", where),
            linear_value_head_dim=_int(text, "linear_value_head_dim", where),
            conv_kernel=_int(text, "linear_conv_kernel_dim", where, default=4, minimum=2),
        )
        if gdn["linear_num_value_heads"] % gdn["linear_num_key_heads"]:
            raise UsageError(f"{where}: linear_num_value_heads must be a multiple of linear_num_key_heads")
    dense_inter = 0 if (moe is not None and all(moe.moe_layers)) else _int(text, "intermediate_size", where)
    return HybridConfig(
        model_type=mt, vocab_size=_int(text, "vocab_size", where), hidden_size=hidden, intermediate_size=dense_inter,
        num_hidden_layers=n, num_attention_heads=heads, num_key_value_heads=_int(text, "num_key_value_heads", where, default=heads),
        head_dim=head_dim, rms_norm_eps=_float(text, "rms_norm_eps", where, 1e-6), rope=parse_rope(text), rotary_dim=rotary_dim,
        tie_word_embeddings=bool(text.get("tie_word_embeddings", False)), layer_types=tuple(types),
        gated_attention=gdn_family and bool(text.get("attn_output_gate", True)), zero_centred_norms=gdn_family,
        packed_gdn=mt == "qwen3_next", ssm_dtype=ssm, moe=moe,
        max_position_embeddings=_int(text, "max_position_embeddings", where, default=32768), wrapped=wrapped, raw=cfg, **gdn,
    )


def _parse_moe(text: dict[str, Any], mt: str, n: int, where: str) -> MoEConfig | None:
    experts = text.get("num_experts", text.get("num_local_experts"))
    if mt == "qwen3_5_text" or not experts:
        return None
    experts = _int({"num_experts": experts}, "num_experts", where)
    if mt == "qwen3_5_moe_text":
        layers = (True,) * n
        norm = True
    else:
        step = _int(text, "decoder_sparse_step", where, default=1)
        only = set(text.get("mlp_only_layers") or [])
        layers = tuple(i not in only and (i + 1) % step == 0 for i in range(n))
        norm = bool(text.get("norm_topk_prob", mt == "qwen3_next"))
    shared = _int(text, "shared_expert_intermediate_size", where, default=0, minimum=0) if mt != "qwen3_moe" else 0
    return MoEConfig(num_experts=experts, top_k=_int(text, "num_experts_per_tok", where),
                     intermediate_size=_int(text, "moe_intermediate_size", where), norm_topk_prob=norm,
                     shared_intermediate_size=shared, moe_layers=layers)
