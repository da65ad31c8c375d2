"""Random tiny hybrid (Gated DeltaNet + attention) and MoE targets as Hugging Face directories, for tests.

`random_hybrid_dir(out_dir, kind)` builds a seeded random model with transformers' own classes (the test
oracle; the product's engine never imports them), saves it with `save_pretrained` (fp32 safetensors +
config), copies the toy tokenizer files beside it, and (by default) writes a random DFlash drafter in z-lab's
layout (`DFlashDraftModel`, `dflash_config.{mask_token_id,target_layer_ids}`) next to it.

Kinds: "qwen3_5_text" (Qwen3_5ForCausalLM), "qwen3_5" (Qwen3_5ForConditionalGeneration: a `text_config`
inside, a tiny vision tower whose weights the engine ignores), "qwen3_next" (packed `in_proj_qkvz` /
`in_proj_ba`, MoE MLP with a shared expert, one dense layer), "qwen3_5_moe" (GDN + MoE), "qwen3_moe"
(plain attention + MoE, no GDN). Tiny: hidden 64, 4 layers unless `layer_types` says otherwise.

`oracle_model(dirs.target)` loads the saved target back through transformers in fp32 (pure-torch fallbacks)
for the oracle tests; `build_world` / `world_from_dirs` pair it with the engine's target and drafter; and
`two_rounds` is the per-node oracle (a): two verify rounds of deep, branching trees whose every node is
checked against transformers on its root path. Uses only the engine's public loading, tree and cache calls.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from ddtree_bench.engine.tree import build_tree, compile_tree, verify_mask

TOY_TARGET = Path(__file__).resolve().parents[1] / "ddtree_bench" / "models" / "toy" / "target"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
VOCAB = 272            # the toy tokenizer's vocabulary
MASK_TOKEN_ID = 259    # the toy drafter's mask token
EOS_TOKEN_ID = 258
KINDS = ("qwen3_5_text", "qwen3_5", "qwen3_next", "qwen3_5_moe", "qwen3_moe")


@dataclass(frozen=True)
class HybridDirs:
    target: Path
    draft: Path | None


def _default_layer_types(n: int) -> list[str]:
    return ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]


def _text_fields(kind: str, layer_types: list[str]) -> dict:
    """Config fields shared by the tiny text models (hidden 64)."""
    f = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=len(layer_types),
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=4096,
        initializer_range=0.1, tie_word_embeddings=False, eos_token_id=EOS_TOKEN_ID, pad_token_id=256,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    if kind != "qwen3_moe":
        f.update(layer_types=layer_types, linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                 linear_num_key_heads=2, linear_num_value_heads=4)
        f["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
    if kind in ("qwen3_next", "qwen3_5_moe", "qwen3_moe"):
        f.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    if kind in ("qwen3_next", "qwen3_5_moe"):
        f.update(shared_expert_intermediate_size=48)
    if kind == "qwen3_next":
        f.update(mlp_only_layers=[0], norm_topk_prob=True)      # layer 0 keeps a dense MLP
    if kind == "qwen3_moe":
        f.update(norm_topk_prob=True, mlp_only_layers=[1])
    return f


def _build_target(kind: str, layer_types: list[str]):
    """A transformers model of the given kind with the tiny config (random init by transformers)."""
    f = _text_fields(kind, layer_types)
    if kind == "qwen3_5_text":
        from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
        return Qwen3_5ForCausalLM(Qwen3_5TextConfig(**f))
    if kind == "qwen3_5":
        from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
        f["rope_parameters"] = dict(f["rope_parameters"], mrope_section=[1, 1, 0], mrope_interleaved=True)
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4, temporal_patch_size=2,
                      spatial_merge_size=2, out_hidden_size=64, num_position_embeddings=16)
        return Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=f, vision_config=vision,
                                                             tie_word_embeddings=False))
    if kind == "qwen3_next":
        from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
        return Qwen3NextForCausalLM(Qwen3NextConfig(**f))
    if kind == "qwen3_5_moe":
        from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
        f.pop("intermediate_size")
        return Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**f))
    if kind == "qwen3_moe":
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
        return Qwen3MoeForCausalLM(Qwen3MoeConfig(**f))
    raise ValueError(f"unknown kind {kind!r}; expected one of {KINDS}")


@torch.no_grad()
def _perturb(model, g: torch.Generator) -> None:
    """transformers initialises norms to their identity (zeros for the (1+w) norms, ones otherwise) and
    biases to zero; random values there make a wrong norm convention or a dropped bias visible."""
    for name, p in model.named_parameters():
        if "norm" in name or name.endswith("dt_bias") or name.endswith(".bias"):
            p.add_(0.2 * torch.randn(p.shape, generator=g))


def _draft_config(target_layers: int, layer_ids: list[int], seed: int) -> dict:
    n = 2
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "vocab_size": VOCAB, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": n, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "attention_bias": False, "tie_word_embeddings": False, "block_size": 8,
        "num_target_layers": target_layers, "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 64, "dflash_config": {"mask_token_id": MASK_TOKEN_ID, "target_layer_ids": layer_ids},
        "torch_dtype": "float32",
    }


def _write_drafter(out: Path, target_layers: int, seed: int) -> None:
    """A random DFlash drafter in z-lab's layout, built with the engine's drafter class (its tensor names are
    z-lab's: fc, hidden_norm, layers.*, norm); the target's embedding / lm_head are shared at run time."""
    from ddtree_bench.engine.config import parse_draft_config
    from ddtree_bench.engine.draft import DFlashDrafter
    from ddtree_bench.engine.loading import save_hf

    ids = sorted({0, target_layers // 2, target_layers - 1}) if target_layers > 2 else list(range(target_layers))
    cfg = _draft_config(target_layers, ids, seed)
    stand_in = SimpleNamespace(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=target_layers)
    drafter = DFlashDrafter(parse_draft_config(cfg, stand_in))
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    save_hf(drafter, cfg, out)


def random_hybrid_dir(out_dir: Path, kind: str = "qwen3_5_text", *, seed: int = 0, with_drafter: bool = True,
                      layer_types: list[str] | None = None, logit_scale: float = 1.0) -> HybridDirs:
    """Write `<out_dir>/target` (and `<out_dir>/draft`) for a seeded random tiny model of `kind`.
    `logit_scale` multiplies lm_head: random tiny models have top-1 minus top-2 gaps of ~0.2, all near ties
    for `gate`; x30 makes most gaps decisive, so a wrong token fails the exact-match rule."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {KINDS}")
    out_dir = Path(out_dir)
    types = list(layer_types) if layer_types is not None else _default_layer_types(4)
    torch.manual_seed(seed)
    model = _build_target(kind, types)
    _perturb(model, torch.Generator().manual_seed(seed))
    if logit_scale != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(logit_scale)
    target = out_dir / "target"
    model.to(torch.float32).save_pretrained(target, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy(TOY_TARGET / name, target / name)
    draft = None
    if with_drafter:
        draft = out_dir / "draft"
        _write_drafter(draft, len(types), seed)
    return HybridDirs(target=target, draft=draft)


def oracle_model(target_dir: Path):
    """The saved target loaded back by transformers in fp32 (text-only causal LM), eval mode."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    cfg = json.loads((Path(target_dir) / "config.json").read_text())
    cls = AutoModelForImageTextToText if cfg.get("model_type") == "qwen3_5" else AutoModelForCausalLM
    return cls.from_pretrained(target_dir, dtype=torch.float32).eval()


# ---------------------------------------------------------------------------- test worlds (oracle + engine)

# The random tiny configs the oracle tests run on: two GDN layer patterns, the conditional-generation
# layout, Qwen3-Next's packed projections with MoE, Qwen3.5-MoE; Qwen3-MoE has no GDN (loop tests only).
CONFIGS = {
    "qwen3_5_text": dict(kind="qwen3_5_text", layer_types=None),
    "qwen3_5-attn-first": dict(kind="qwen3_5", layer_types=["full_attention", "linear_attention", "linear_attention",
                                                             "full_attention", "linear_attention", "linear_attention"]),
    "qwen3_next": dict(kind="qwen3_next", layer_types=None),
    "qwen3_5_moe": dict(kind="qwen3_5_moe", layer_types=None),
}


@dataclass
class HybridWorld:
    name: str
    dirs: HybridDirs
    oracle: object            # transformers' model, fp32, eval
    target: object            # the engine's HybridTarget
    drafter: object           # the engine's DFlash drafter (random weights)

    @torch.inference_mode()
    def oracle_logits(self, seq: list[int]) -> torch.Tensor:
        """transformers' logits [len(seq), V] of seq run as one plain sequence (no cache)."""
        return self.oracle(torch.tensor([seq])).logits[0].float()

    @torch.inference_mode()
    def oracle_greedy(self, prompt: list[int], n: int) -> list[int]:
        """transformers' greedy `generate` (with its own cache), EOS disabled so exactly n tokens come back."""
        out = self.oracle.generate(torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                   eos_token_id=None, pad_token_id=0)
        return out[0, len(prompt):].tolist()


def build_world(root: Path, name: str, seed: int = 0) -> HybridWorld:
    from transformers.utils import logging as hf_logging

    from ddtree_bench.engine.loading import load_drafter, load_target

    hf_logging.set_verbosity_error()
    spec = CONFIGS.get(name, dict(kind=name, layer_types=None))
    dirs = random_hybrid_dir(root / name, spec["kind"], seed=seed, layer_types=spec["layer_types"])
    target = load_target(dirs.target)
    return HybridWorld(name, dirs, oracle_model(dirs.target), target, load_drafter(dirs.draft, target.cfg))


def world_from_dirs(name: str, target_dir: Path, draft_dir: Path) -> HybridWorld:
    """A HybridWorld over existing directories (the bundled toy hybrid pair)."""
    from transformers.utils import logging as hf_logging

    from ddtree_bench.engine.loading import load_drafter, load_target

    hf_logging.set_verbosity_error()
    target = load_target(target_dir)
    return HybridWorld(name, HybridDirs(Path(target_dir), Path(draft_dir)), oracle_model(target_dir), target,
                       load_drafter(draft_dir, target.cfg))


# ---------------------------------------------------------------------------- the per-node oracle (a)

ATOL = 1e-4   # max |logit difference| a node may have from transformers on its root path (fp32)


def deep_tree(V: int, seed: int, budget: int = 40, L: int = 9):
    """A tree with siblings and root paths longer than the conv kernel (K = 4): one favoured token per depth."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(L, V, generator=g)
    logits[torch.arange(L), torch.randint(V, (L,), generator=g)] += 8.0     # a strong spine ...
    logits[torch.arange(L), torch.randint(V, (L,), generator=g)] += 6.5     # ... with a runner-up (siblings)
    return build_tree(logits, budget)


def root_paths(tree) -> list[list[int]]:
    """Node indices (verify order, root = 0) of every verify row's root path."""
    par = [0] + tree.parents.tolist()
    out = [[0]]
    for i in range(1, len(par)):
        out.append(out[par[i]] + [i])
    return out


@torch.inference_mode()
def run_round(world, cache, start: int, bonus: int, tree):
    vids, vpos, anc = compile_tree(tree, bonus, start)
    logits, _ = world.target(vids, vpos, cache, start, mask=verify_mask(anc, start))
    return vids, logits


def node_errors(world, prefix: list[int], vids, logits, tree) -> list[float]:
    """Per node: max |logit difference| to transformers on prefix + root path (inf if the argmax differs)."""
    errs = []
    for i, path in enumerate(root_paths(tree)):
        ref = world.oracle_logits(prefix + vids[path].tolist())[-1]
        d = float((logits[i] - ref).abs().max())
        errs.append(d if int(logits[i].argmax()) == int(ref.argmax()) else float("inf"))
    return errs


def sibling_path(tree) -> list[int]:
    """The deepest root path that goes through a non-first child somewhere (a later sibling)."""
    paths = root_paths(tree)
    firsts = {}
    for i, p in enumerate(tree.parents.tolist(), start=1):
        firsts.setdefault(p, i)
    later = [p for p in paths if any(firsts[p[j - 1]] != p[j] for j in range(1, len(p)))]
    return max(later, key=len)


def two_rounds(world, mode: str, commit_mode: str = "full", seed: int = 0):
    """Prefill, verify tree 1, commit a sibling path, verify tree 2. Returns (per-node errors of both rounds,
    logits of both rounds, committed states after round 1)."""
    t = world.target
    t.tree_mode, t.commit_mode = mode, commit_mode
    try:
        prompt = list(range(3, 3 + 20 + seed))
        cache = t.new_cache(200)
        with torch.inference_mode():
            lg, _ = t(torch.tensor(prompt), torch.arange(len(prompt)), cache, 0)
        bonus = int(lg[-1].argmax())
        V = t.cfg.vocab_size
        tree1 = deep_tree(V, seed)
        vids1, logits1 = run_round(world, cache, len(prompt), bonus, tree1)
        errs = node_errors(world, prompt, vids1, logits1, tree1)
        path = sibling_path(tree1)
        assert len(path) > t.cfg.conv_kernel, "the committed path should be longer than the conv kernel"
        cache.commit(len(prompt), path)
        states = {i: (s.conv.clone(), s.S.clone()) for i, s in cache.states.items()}
        prefix = prompt + vids1[path].tolist()
        bonus2 = int(logits1[path[-1]].argmax())
        tree2 = deep_tree(V, seed + 100)
        vids2, logits2 = run_round(world, cache, len(prefix), bonus2, tree2)
        errs += node_errors(world, prefix, vids2, logits2, tree2)
        return errs, (logits1, logits2), states
    finally:
        t.tree_mode, t.commit_mode = "depth", "full"


