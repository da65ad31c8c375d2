"""Random weights in the exact shapes of real targets and their DFlash drafters, for speed work.

`random_shaped_pair("qwen3-8b", dtype="bfloat16", device="cuda")` builds the modules on the meta
device, then allocates them on the target device and fills them there (normal(0, 1/fan_in) for
matrices, 1 + N(0, 0.1) for norm weights), so an 8B model never exists in fp32 or on the CPU.
Random weights cost exactly what real ones do (no zeros: METHOD.md), but their drafter accepts
nothing: use them for stage times and verify-cost curves, never for acceptance.

Shapes follow the published config.json files (Qwen3-8B/4B/1.7B, Llama-3.1-8B); the drafter is
z-lab's DFlash layout: 5 layers of the target's width, block 16, target_layer_ids by z-lab's rule
([1, 9, 17, 25, 33] for 36 layers), mask token 151669 for Qwen3. Knows nothing of timing.
"""

from __future__ import annotations

import torch

from ddtree_bench.engine.config import parse_draft_config, parse_target_config
from ddtree_bench.engine.draft import DFlashDrafter
from ddtree_bench.engine.layers import rope_inv_freq
from ddtree_bench.engine.loading import resolve_device, torch_dtype
from ddtree_bench.engine.model import Target
from ddtree_bench.errors import UsageError

_QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "head_dim": 128,
          "num_key_value_heads": 8, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
          "hidden_act": "silu"}
SHAPES: dict[str, dict] = {
    "qwen3-8b": {**_QWEN3, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "tie_word_embeddings": False},
    "qwen3-4b": {**_QWEN3, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "tie_word_embeddings": True},
    "qwen3-1.7b": {**_QWEN3, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "tie_word_embeddings": True},
    "qwen3-32b": {**_QWEN3, "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64,
                  "num_attention_heads": 64, "tie_word_embeddings": False},
    "llama3-8b": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
                  "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                  "head_dim": 128, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
                  "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 8192},
                  "max_position_embeddings": 131072, "hidden_act": "silu"},
}
# Hybrid (Gated DeltaNet) shapes: perf/bench_hybrid.py builds these (engine/hybrid/); facts from
# docs/hybrid-targets.md (third-party copies of Qwen/Qwen3.6-27B's config.json and z-lab's drafter).
HYBRID_SHAPES: dict[str, dict] = {
    "qwen3.6-27b": {
        "target": {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "tie_word_embeddings": False,
                   "text_config": {"model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 5120,
                                   "intermediate_size": 17408, "num_hidden_layers": 64, "full_attention_interval": 4,
                                   "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256,
                                   "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "hidden_act": "silu",
                                   "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
                                   "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
                                   "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32"}},
        "draft": {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "vocab_size": 248320, "hidden_size": 5120,
                  "intermediate_size": 17408, "num_hidden_layers": 5, "num_attention_heads": 32, "num_key_value_heads": 8,
                  "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000000.0, "block_size": 16,
                  "layer_types": ["sliding_attention"] * 4 + ["full_attention"], "sliding_window": 2048,
                  "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 16, 31, 46, 61]}},
        "dense_twin": "qwen3-32b",
    },
}
DRAFT_LAYERS = 5
BLOCK_SIZE = 16
MASK_TOKEN = {"qwen3": 151669, "llama": 128255}


def shape_configs(shape: str | dict) -> tuple[dict, dict]:
    """HF-style config dicts (target, DFlash drafter) of a named shape, or of a target config dict."""
    if isinstance(shape, str):
        if shape not in SHAPES:
            raise UsageError(f"unknown --shape {shape!r}; expected one of {', '.join(list(SHAPES) + list(HYBRID_SHAPES))}")
        shape = SHAPES[shape]
    t = dict(shape)
    draft = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "vocab_size": t["vocab_size"],
        "hidden_size": t["hidden_size"], "intermediate_size": t["intermediate_size"], "num_hidden_layers": DRAFT_LAYERS,
        "num_attention_heads": t["num_attention_heads"], "num_key_value_heads": t["num_key_value_heads"],
        "head_dim": t["head_dim"], "rms_norm_eps": t["rms_norm_eps"], "rope_theta": t["rope_theta"],
        "block_size": BLOCK_SIZE, "num_target_layers": t["num_hidden_layers"],
        "dflash_config": {"mask_token_id": min(MASK_TOKEN.get(t["model_type"], t["vocab_size"] - 1), t["vocab_size"] - 1)},
    }
    return t, draft


def _fill(module: torch.nn.Module, gen: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32))
            else:
                p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5, generator=gen)


def _materialise(module, rope, head_dim: int, device, dtype, gen) -> torch.nn.Module:
    module = module.to(dtype)                               # cast on meta first: nothing is ever made in fp32
    module.rotary.inv_freq = rope_inv_freq(rope, head_dim)  # real (tiny) data: Rotary keeps it in fp32 through moves
    module = module.to_empty(device=device)
    _fill(module, gen)
    return module.eval()


def random_shaped_pair(shape: str | dict = "qwen3-8b", dtype: str = "bfloat16", device: str = "cuda", seed: int = 0,
                       with_drafter: bool = True) -> tuple[Target, DFlashDrafter | None]:
    """Target (+ DFlash drafter) of a real model's shape with random weights, made on `device` in `dtype`."""
    dev = resolve_device(device)
    dt = torch_dtype(dtype)
    tcfg_d, dcfg_d = shape_configs(shape)
    tcfg = parse_target_config(tcfg_d)
    dcfg = parse_draft_config(dcfg_d, tcfg) if with_drafter else None
    gen = torch.Generator(device=dev).manual_seed(seed)
    with torch.device("meta"):
        target = Target(tcfg)
        drafter = DFlashDrafter(dcfg) if with_drafter else None
    target = _materialise(target, tcfg.rope, tcfg.head_dim, dev, dt, gen)
    if tcfg.tie_word_embeddings:
        target.lm_head.weight = target.model.embed_tokens.weight
    if drafter is not None:
        drafter = _materialise(drafter, dcfg.rope, dcfg.head_dim, dev, dt, gen)
    return target, drafter


def param_count(shape: str | dict, drafter: bool = False) -> int:
    """Parameters of a shape (tied embeddings counted once), computed on the meta device."""
    tcfg_d, dcfg_d = shape_configs(shape)
    tcfg = parse_target_config(tcfg_d)
    with torch.device("meta"):
        m = DFlashDrafter(parse_draft_config(dcfg_d, tcfg)) if drafter else Target(tcfg)
        if not drafter and tcfg.tie_word_embeddings:
            m.lm_head.weight = m.model.embed_tokens.weight
    return sum(p.numel() for p in m.parameters())


def weights_bytes(shape: str, dtype: str) -> int:
    """Bytes of random weights `bench-engine --shape` holds at once in `dtype`: a dense shape's target and drafter; a
    hybrid shape's target, or its dense twin if larger (built one after the other). Meta device: nothing allocated."""
    size = torch.finfo(torch_dtype(dtype)).bits // 8
    if shape in HYBRID_SHAPES:
        from ddtree_bench.engine.hybrid.config import parse_hybrid_config
        from ddtree_bench.engine.hybrid.model import HybridTarget

        with torch.device("meta"):
            m = HybridTarget(parse_hybrid_config(HYBRID_SHAPES[shape]["target"], "shape"))
        hybrid = sum(p.numel() for p in {id(p): p for p in m.parameters()}.values())
        twin = HYBRID_SHAPES[shape].get("dense_twin")
        return size * max(hybrid, param_count(twin) if twin else 0)
    return size * (param_count(shape) + param_count(shape, drafter=True))


def available_bytes(device: str) -> int | None:
    """Memory a run on `device` can take: free CUDA memory, else the host's MemAvailable (None where unknown)."""
    dev = resolve_device(device)
    if dev.type == "cuda":
        return torch.cuda.mem_get_info(dev)[0]
    try:
        for line in open("/proc/meminfo", encoding="ascii"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_fits(shape: str, dtype: str, device: str) -> None:
    """UsageError when the shape's weights alone exceed what `device` has free (a CPU run was OOM-killed or got an
    allocator error after minutes); the message says how much each side has."""
    need, have = weights_bytes(shape, dtype), available_bytes(device)
    if have is not None and need > have:
        gib = 1 << 30
        raise UsageError(f"--shape {shape} in {dtype} needs {need / gib:.1f} GiB of weights; {device} has "
                         f"{have / gib:.1f} GiB available", hint="use --device cuda --dtype bfloat16, or a smaller --shape")
