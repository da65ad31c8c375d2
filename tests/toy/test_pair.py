"""The bundled toy pair: loads in the engine and in transformers, stays lossless, and its tokenizer
and chat template behave like a Hugging Face one."""

from __future__ import annotations

import json
import random

import pytest
import torch

from ddtree_bench.pair import TOY_DIR, load_pair
from ddtree_bench.toy import tokenizer as btok

TARGET, DRAFT = TOY_DIR / "target", TOY_DIR / "draft"
PROMPTS = [
    "Tom has 3 apples and buys 5 more. How many apples does he have?\nPlease reason step by step, and put your final answer within \\boxed{}.",
    "Write a solution to the following problem and make sure that it passes the tests:\n```python\ndef add(a, b):\n    \"\"\"Return a + b.\"\"\"\n\n```",
    "Tell me about the sea.",
]


@pytest.fixture(scope="module")
def pair():
    return load_pair("toy", None, "ddtree")


def test_pair_is_small_and_in_the_documented_formats():
    size = sum(p.stat().st_size for d in (TARGET, DRAFT) for p in d.iterdir())
    assert size <= 12_000_000, size
    tcfg = json.loads((TARGET / "config.json").read_text())
    assert tcfg["architectures"] == ["Qwen3ForCausalLM"] and tcfg["model_type"] == "qwen3"
    dcfg = json.loads((DRAFT / "config.json").read_text())
    assert dcfg["architectures"] == ["DFlashDraftModel"] and dcfg["model_type"] == "qwen3"
    assert dcfg["block_size"] == 16 and dcfg["num_target_layers"] == tcfg["num_hidden_layers"]
    assert dcfg["dflash_config"]["mask_token_id"] == btok.MASK < tcfg["vocab_size"]
    gen = json.loads((TARGET / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [btok.IM_END, btok.ENDOFTEXT]
    from safetensors import safe_open

    with safe_open(str(DRAFT / "model.safetensors"), "pt") as f:
        assert {k.split(".")[0] for k in f.keys()} == {"fc", "hidden_norm", "layers", "norm"}


def test_default_stop_ids_come_from_generation_config(pair):
    assert pair.stop_ids == [btok.IM_END, btok.ENDOFTEXT]


# Mean acceptance length tau over PROMPTS (fp32, CPU, measured 2026-12-01 with the last-round rule):
# a lossless test cannot see a wrong drafter context or tree - they only lower tau - so tau is pinned
# near its measured value. TAU_REL_TOL = 5% leaves room for a near-tie flipping one round on another
# CPU's BLAS (one round moves a prompt's tau by ~2-10%, the mean by a third of that) and catches any
# real loss (an off-by-one drafter context drops tau below 2).
TAU = {("dflash", 0): 3.893, ("ddtree", 32): 5.898, ("ddtree", 128): 6.193}
TAU_REL_TOL = 0.05


def test_ddtree_and_dflash_equal_ar_greedy_and_accept_tokens(pair):
    taus: dict[tuple[str, int], list[float]] = {}
    for text in PROMPTS:
        ids = pair.tokenizer.apply_chat_template([{"role": "user", "content": text}])
        ar = pair.engine.generate(ids, "ar", max_new_tokens=96, stop_ids=pair.stop_ids)
        for method, budget in TAU:
            g = pair.engine.generate(ids, method, budget=budget, max_new_tokens=96, stop_ids=pair.stop_ids)
            assert g.output_ids == ar.output_ids, (text[:30], method, budget)
            taus.setdefault((method, budget), []).append(sum(g.accept_lengths) / len(g.accept_lengths))
    mean = {k: sum(v) / len(v) for k, v in taus.items()}
    for k, want in TAU.items():
        assert mean[k] == pytest.approx(want, rel=TAU_REL_TOL), (k, mean[k], taus[k])
    assert mean[("ddtree", 128)] >= mean[("ddtree", 32)] > mean[("dflash", 0)]


def test_transformers_loads_the_pair_and_agrees_token_for_token(pair):
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(TARGET), dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(str(TARGET))
    for text in PROMPTS[:2]:
        messages = [{"role": "user", "content": text}]
        hf_ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert tok.encode(hf_ids, add_special_tokens=False) == pair.tokenizer.apply_chat_template(messages)
        ids = pair.tokenizer.apply_chat_template(messages)
        ours = pair.engine.generate(ids, "ar", max_new_tokens=48, stop_ids=pair.stop_ids).output_ids
        out = model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False, eos_token_id=pair.stop_ids,
                             pad_token_id=btok.ENDOFTEXT)
        assert out[0, len(ids):].tolist() == ours


def test_tokenizer_round_trips_arbitrary_unicode(pair):
    rng = random.Random(0)
    alphabet = [chr(c) for c in list(range(0x20, 0x7F)) + [0x0A, 0x09, 0xE9, 0x4E16, 0x754C, 0x1F389, 0x0627, 0x05D0, 0x2603]]
    for _ in range(200):
        s = "".join(rng.choice(alphabet) if rng.random() < 0.8 else chr(rng.randrange(0x20, 0x10FFFF))
                    for _ in range(rng.randrange(0, 60)))
        s = s.encode("utf-8", "replace").decode("utf-8")  # drop lone surrogates, which UTF-8 cannot carry
        ids = pair.tokenizer.encode(s)
        assert len(ids) == len(s.encode("utf-8"))
        assert pair.tokenizer.decode(ids) == s


def test_chat_template_renders_multi_turn_conversations(pair):
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    text = pair.tokenizer.render(messages)
    assert text == ("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
                    "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n")
    ids = pair.tokenizer.apply_chat_template(messages)
    assert ids.count(btok.IM_START) == 4 and ids.count(btok.IM_END) == 3 and ids[-1] == ord("\n")
