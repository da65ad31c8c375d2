"""The bundled toy hybrid pair (`--model toy-hybrid`): small, in the documented formats (a Qwen3.5 text
target transformers loads as it is; a z-lab DFlash drafter shaped like z-lab's Qwen3.6 drafter), and
recorded by the recipe that `toy train --hybrid` runs. Its losslessness and acceptance are the engine's
oracle tests (tests/engine/hybrid/test_toy_hybrid.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from ddtree_bench.pair import TOY_HYBRID_DIR, model_dirs
from ddtree_bench.toy import tokenizer as btok

TARGET, DRAFT = TOY_HYBRID_DIR / "target", TOY_HYBRID_DIR / "draft"
SIZE_LIMIT_BYTES = 15_000_000   # the bound on what the pair adds to the package


def test_pair_is_small_and_resolves_by_name():
    size = sum(p.stat().st_size for d in (TARGET, DRAFT) for p in d.iterdir()) + (TOY_HYBRID_DIR / "TRAINING.json").stat().st_size
    assert size <= SIZE_LIMIT_BYTES, size
    assert model_dirs("toy-hybrid", None) == (TARGET, DRAFT)


def test_target_is_a_qwen3_5_hybrid_and_the_drafter_has_the_qwen3_6_drafter_shape():
    t = json.loads((TARGET / "config.json").read_text())
    assert t["model_type"] == "qwen3_5_text" and t["architectures"] == ["Qwen3_5ForCausalLM"]
    types = t["layer_types"]
    assert types == ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(t["num_hidden_layers"])]
    d = json.loads((DRAFT / "config.json").read_text())
    assert d["architectures"] == ["DFlashDraftModel"] and d["block_size"] == 16 and d["num_target_layers"] == len(types)
    assert d["layer_types"][-1] == "full_attention" and set(d["layer_types"][:-1]) == {"sliding_attention"}
    assert d["sliding_window"] > 0
    ids = d["dflash_config"]["target_layer_ids"]
    assert {types[i] for i in ids} == {"linear_attention", "full_attention"} and max(ids) < len(types) - 1
    assert d["dflash_config"]["mask_token_id"] == btok.MASK
    from safetensors import safe_open

    with safe_open(str(DRAFT / "model.safetensors"), "pt") as f:
        assert {k.split(".")[0] for k in f.keys()} == {"fc", "hidden_norm", "layers", "norm"}
    gen = json.loads((TARGET / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [btok.IM_END, btok.ENDOFTEXT]


def test_training_record_is_the_recipe_toy_train_hybrid_runs():
    from ddtree_bench.toy.train_hybrid import HybridRecipe

    rec = json.loads((TOY_HYBRID_DIR / "TRAINING.json").read_text())
    want = dataclasses.asdict(HybridRecipe())
    want["target_layer_ids"] = list(want["target_layer_ids"])
    got = {k: v for k, v in rec["recipe"].items() if k != "time_budget_s"}
    assert got == {k: v for k, v in want.items() if k != "time_budget_s"}
    text = (TOY_HYBRID_DIR / "TRAINING.json").read_text()
    assert "/work/" not in text and "/root/" not in text


def test_transformers_loads_the_target_as_it_is():
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(TARGET), dtype=torch.float32).eval()
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    tok = transformers.AutoTokenizer.from_pretrained(str(TARGET))
    messages = [{"role": "user", "content": "What is 3 + 4?"}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    from ddtree_bench.tokenizer import ChatTokenizer

    assert tok.encode(text, add_special_tokens=False) == ChatTokenizer(TARGET).apply_chat_template(messages)
