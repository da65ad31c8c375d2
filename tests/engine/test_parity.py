"""Parity of the engine's target with transformers' Qwen3ForCausalLM / LlamaForCausalLM (the oracle;
transformers is a dev dependency only) on random tiny configs saved with `save_pretrained` and
loaded with `engine.loading.load_target`: logits (full forward, incremental decoding through the
KV cache, and tree verification against per-path HF forwards) within 1e-4 in fp32, and the hidden
states of every layer equal to HF's `hidden_states[i + 1]` (the last one after the final norm).
"""

from __future__ import annotations

import json

import pytest
import torch

from ddtree_bench.engine.loading import load_target
from ddtree_bench.engine.tree import build_tree, compile_tree, verify_mask
from engine_support import one_torch_thread  # noqa: F401 (fixture)

transformers = pytest.importorskip("transformers")

TOL = 1e-4
BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, rms_norm_eps=1e-6, max_position_embeddings=256)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}

CASES = {
    # Qwen3: q/k norm, head_dim != hidden / heads, untied head
    "qwen3": ("Qwen3", dict(head_dim=24, tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    # Llama-3.x: llama3 RoPE scaling (all three frequency bands at head_dim 16), tied embeddings, biases
    "llama3-tied": ("Llama", dict(head_dim=16, tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
                                  rope_parameters=LLAMA3_ROPE)),
    # Llama with linear RoPE scaling, written in the transformers<5 spelling (rope_theta + rope_scaling)
    "llama-linear-v4": ("Llama", dict(head_dim=16, tie_word_embeddings=False,
                                      rope_parameters={"rope_type": "linear", "rope_theta": 5000.0, "factor": 2.0})),
}


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """HF's 0.02-std init makes every logit ~0, which would make a 1e-4 bound meaningless; use
    unit-scale weights so logits span several units."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    family, extra = CASES[request.param]
    cfg = getattr(transformers, f"{family}Config")(**BASE, **extra)
    hf = getattr(transformers, f"{family}ForCausalLM")(cfg)
    _randomise(hf, seed=len(request.param))
    hf = hf.float().eval()
    hf.config._attn_implementation = "eager"
    d = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(d)
    if request.param.endswith("-v4"):  # rewrite the config in the older spelling the engine also reads
        c = json.loads((d / "config.json").read_text())
        rp = c.pop("rope_parameters")
        c["rope_theta"] = rp.pop("rope_theta")
        c["rope_scaling"] = {"type": rp.pop("rope_type"), **rp}
        (d / "config.json").write_text(json.dumps(c))
    ours = load_target(d, "float32")
    return request.param, hf, ours


def _hf(hf, ids: list[int]):
    with torch.no_grad():
        out = hf(torch.tensor([ids]), output_hidden_states=True)
    return out.logits[0], [h[0] for h in out.hidden_states]


def test_config_read_as_written(pair):
    name, hf, ours = pair
    c = ours.cfg
    assert c.qk_norm == name.startswith("qwen3")
    assert c.tie_word_embeddings == hf.config.tie_word_embeddings
    if c.tie_word_embeddings:
        assert ours.lm_head.weight.data_ptr() == ours.model.embed_tokens.weight.data_ptr()
    assert c.rope.kind == {"qwen3": "default", "llama3-tied": "llama3", "llama-linear-v4": "linear"}[name]


def test_full_forward_logits_and_hidden_states(pair):
    name, hf, ours = pair
    ids = torch.randint(0, 96, (48,), generator=torch.Generator().manual_seed(1)).tolist()
    want_logits, want_hidden = _hf(hf, ids)
    n_layers = ours.cfg.num_hidden_layers
    with torch.inference_mode():
        logits, hidden = ours(torch.tensor(ids), torch.arange(len(ids)), ours.new_cache(len(ids)), 0,
                              hidden_layers=tuple(range(n_layers)))
    assert want_logits.abs().max() > 1.0  # a meaningful scale for the bound below
    assert (logits - want_logits).abs().max() <= TOL
    H = ours.cfg.hidden_size
    for i in range(n_layers):
        torch.testing.assert_close(hidden[:, i * H:(i + 1) * H], want_hidden[i + 1], atol=TOL, rtol=TOL)
    # a subset of layers, in the order requested
    with torch.inference_mode():
        _, sub = ours(torch.tensor(ids), torch.arange(len(ids)), ours.new_cache(len(ids)), 0, hidden_layers=(2, 0))
    torch.testing.assert_close(sub, torch.cat([want_hidden[3], want_hidden[1]], dim=-1), atol=TOL, rtol=TOL)


def test_incremental_decoding_through_the_cache(pair):
    _, hf, ours = pair
    ids = torch.randint(0, 96, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    want, _ = _hf(hf, ids)
    cache = ours.new_cache(64)
    with torch.inference_mode():
        got = [ours(torch.tensor(ids[:20]), torch.arange(20), cache, 0)[0]]          # prefill
        got.append(ours(torch.tensor(ids[20:25]), torch.arange(20, 25), cache, 20)[0])  # a causal chunk
        for t in range(25, 40):                                                      # one token at a time
            got.append(ours(torch.tensor([ids[t]]), torch.tensor([t]), cache, t, mask=None)[0])
    assert (torch.cat(got) - want).abs().max() <= TOL


def test_tree_verify_matches_per_path_forwards(pair):
    """One masked forward over [root, tree...] gives, at every node, HF's logits for prefix + path."""
    _, hf, ours = pair
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(0, 96, (12,), generator=g).tolist()
    root = 5
    tree = build_tree(torch.randn(4, 96, generator=g) * 3, 12)
    start = len(prefix)
    vids, vpos, anc = compile_tree(tree, root, start)
    cache = ours.new_cache(64)
    with torch.inference_mode():
        ours(torch.tensor(prefix), torch.arange(start), cache, 0)
        logits, _ = ours(vids, vpos, cache, start, mask=verify_mask(anc, start))
    paths = [()] + tree.paths()
    for i, path in enumerate(paths):
        want, _ = _hf(hf, prefix + [root] + list(path))
        assert (logits[i] - want[-1]).abs().max() <= TOL, (i, path)
