"""The toy hybrid training code: its batched forwards agree with the engine's drafter and with
transformers' own greedy decoding, and a tiny run writes a pair that transformers and the engine's
DFlash loader load (the committed pair is made by the same code with the default HybridRecipe)."""

from __future__ import annotations

import dataclasses
import json
import sys
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("transformers.models.qwen3_5")

from ddtree_bench.toy import tokenizer as btok  # noqa: E402
from ddtree_bench.toy.train_hybrid import (  # noqa: E402
    HybridRecipe, StageClock, build_drafter, build_target, draft_forward, greedy_continue, layer_types,
    target_features,
)

# 5 target layers (GDN x3, full attention, GDN); drafter [sliding, sliding, full] with a window of 8, so the
# window cuts into both the context and (for the causal sliding layers) nothing of a 16-token block.
TINY = HybridRecipe(hidden=64, layers=5, heads=2, kv_heads=1, head_dim=32, linear_key_heads=2, linear_value_heads=4,
                    linear_head_dim=16, intermediate=96, seq_len=128, target_batch=4, target_steps=3,
                    distill_contexts=12, distill_new_tokens=24, distill_batch=8, draft_layers=3, draft_heads=4,
                    draft_kv_heads=2, draft_intermediate=96, sliding_window=8, target_layer_ids=(1, 3), draft_batch=4,
                    anchors_per_seq=3, draft_steps=3, warmup_steps=1)


@pytest.fixture(scope="module")
def target():
    model = build_target(TINY).eval()
    with torch.no_grad():  # transformers' init is near-uniform; spread the logits so argmax is decisive
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(8.0)
    return model


def test_target_is_a_qwen3_5_hybrid_in_the_3_to_1_pattern():
    assert layer_types(HybridRecipe()) == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"]
    r = HybridRecipe()
    types = layer_types(r)
    assert {types[i] for i in r.target_layer_ids} == {"linear_attention", "full_attention"}
    assert max(r.target_layer_ids) < r.layers - 1   # never the last layer: transformers' hidden_states[-1] is after the final norm


def test_target_features_are_decoder_layer_outputs(target):
    ids = torch.randint(0, 256, (2, 30))
    outs = {}
    hooks = [target.model.layers[i].register_forward_hook(lambda m, a, o, i=i: outs.__setitem__(i, o[0] if isinstance(o, tuple) else o))
             for i in TINY.target_layer_ids]
    with torch.no_grad():
        feats = target_features(target, ids, TINY.target_layer_ids)
    for h in hooks:
        h.remove()
    assert torch.equal(feats, torch.cat([outs[i] for i in TINY.target_layer_ids], dim=-1))


def test_draft_forward_equals_engine_drafter_with_sliding_layers(target):
    """Training sees, for a block at anchor a, exactly what the engine's drafter sees at inference,
    sliding (causal, windowed) layers and the full layer alike."""
    torch.manual_seed(3)
    drafter = build_drafter(TINY).eval()
    assert drafter.cfg.layer_causal == (True, True, False) and drafter.cfg.layer_window == (8, 8, None)
    with torch.no_grad():
        for p in drafter.parameters():
            p.normal_(0, 0.3 if p.dim() >= 2 else 1.0)
        ids = torch.randint(0, 256, (1, 60))
        feats = target_features(target, ids, TINY.target_layer_ids)
        anchors = torch.tensor([[5, 23, 40]])
        embed = target.model.embed_tokens
        got = draft_forward(drafter, embed, target.lm_head, feats, ids, anchors)[0]   # [k, 15, V]
        for j, a in enumerate(anchors[0].tolist()):
            block = torch.full((drafter.block_size,), drafter.mask_token_id)
            block[0] = ids[0, a]
            h = drafter(feats[0, :a], embed(block), drafter.new_cache(128), 0, a)
            ref = target.lm_head(h[1:])
            assert torch.allclose(got[j], ref, atol=1e-4), j
        # the window matters: with it removed the first sliding layer's outputs change
        wide = build_drafter(dataclasses.replace(TINY, sliding_window=4096)).eval()
        wide.load_state_dict(drafter.state_dict())
        assert not torch.allclose(draft_forward(wide, embed, target.lm_head, feats, ids, anchors)[0], got, atol=1e-3)


def test_greedy_continue_left_padded_equals_transformers_generate(target):
    torch.manual_seed(4)
    a, b = torch.randint(0, 256, (1, 20)), torch.randint(0, 256, (1, 27))
    batch = torch.cat([torch.cat([torch.full((1, 7), btok.ENDOFTEXT), a], 1), b], 0)
    cont = greedy_continue(target, batch, 12, pad_left=torch.tensor([7, 0]))
    target.generation_config.eos_token_id = None   # greedy_continue ignores EOS too
    for row, x in ((0, a), (1, b)):
        ref = target.generate(x, max_new_tokens=12, do_sample=False, pad_token_id=btok.ENDOFTEXT)
        assert cont[row].tolist() == ref[0, x.shape[1]:].tolist(), row


def test_precomputed_features_equal_the_per_step_forward(target):
    from ddtree_bench.toy.train_hybrid import precompute_features

    torch.manual_seed(5)
    seqs = torch.randint(0, 256, (6, 40))
    ends = torch.tensor([40, 31, 22, 40, 17, 35])
    feats = precompute_features(dataclasses.replace(TINY, draft_batch=4), target, seqs, ends, torch.device("cpu"))
    for row in range(6):   # causal: the positions before a row's end do not depend on what follows
        e = int(ends[row])
        ref = target_features(target, seqs[row: row + 1, :e], TINY.target_layer_ids)[0]
        assert torch.allclose(feats[row, :e], ref, atol=1e-5), row


def test_stage_clock_caps_steps_to_the_budget_after_the_warm_up(monkeypatch):
    import ddtree_bench.toy.train_hybrid as th

    now = [0.0]
    monkeypatch.setattr(th.time, "time", lambda: now[0])

    def run(budget_s, planned, warmup, slow_steps=0):
        clock, fixed, when = StageClock(budget_s, torch.device("cpu")), None, None
        for step in range(200):
            now[0] += 1.0 if step < slow_steps else 0.1   # warm-up steps are slow, then 0.1 s a step
            got = clock.calibrate(step, planned, warmup)
            if got is not None:
                fixed, when = got, step
        return fixed, when

    assert run(10.0, planned=1000, warmup=40)[0] in (99, 100)   # 10 s at 0.1 s a step
    assert run(10.0, planned=1000, warmup=40)[1] == 39         # fixed at the last warm-up step
    # slow first steps cost their time but do not set the rate (the committed pair's run had this flaw)
    assert run(20.0, planned=1000, warmup=40, slow_steps=10)[0] in (109, 110)   # 13 s spent, 7 s left at 0.1 s
    assert run(10.0, planned=50, warmup=40)[0] == 50            # the plan is a ceiling
    assert run(0.5, planned=1000, warmup=40)[0] == 41           # a stage cut for time still ends its warm-up
    assert run(None, planned=1000, warmup=40)[0] is None        # no budget: the plan stands


def test_tiny_training_run_writes_a_pair_transformers_and_the_engine_load(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ddtree_bench.engine.loading import load_drafter
    from ddtree_bench.toy.train_hybrid import train

    meta = train(TINY, tmp_path / "pair", device="cpu", max_files=20, log=lambda m: None)
    tdir, ddir = tmp_path / "pair" / "target", tmp_path / "pair" / "draft"
    tcfg = json.loads((tdir / "config.json").read_text())
    assert tcfg["model_type"] == "qwen3_5_text" and tcfg["architectures"] == ["Qwen3_5ForCausalLM"]
    assert tcfg["layer_types"] == layer_types(TINY)
    dcfg = json.loads((ddir / "config.json").read_text())
    assert dcfg["architectures"] == ["DFlashDraftModel"] and dcfg["block_size"] == 16
    assert dcfg["layer_types"] == ["sliding_attention", "sliding_attention", "full_attention"]
    assert dcfg["dflash_config"] == {"mask_token_id": btok.MASK, "target_layer_ids": [1, 3]}
    assert meta["recipe"]["target_steps"] == 3 and meta["recipe"]["draft_steps"] == 3
    assert json.loads((tmp_path / "pair" / "TRAINING.json").read_text())["recipe"]["distill_contexts"] == 12
    # transformers loads the target as it is, and its tokenizer renders the toy chat template
    model = AutoModelForCausalLM.from_pretrained(str(tdir), dtype=torch.float32).eval()
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    tok = AutoTokenizer.from_pretrained(str(tdir))
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[0] == btok.IM_START and len(model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False)[0]) > len(ids)
    # the engine's DFlash loader reads the drafter (sliding layers causal and windowed, the full one not)
    stand_in = SimpleNamespace(vocab_size=btok.VOCAB_SIZE, hidden_size=TINY.hidden, num_hidden_layers=TINY.layers)
    drafter = load_drafter(ddir, stand_in)
    assert drafter.cfg.layer_window == (8, 8, None) and drafter.target_layer_ids == (1, 3)


def test_hybrid_training_without_transformers_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    from process_support import run_cli

    monkeypatch.setitem(sys.modules, "transformers", None)   # import transformers -> ImportError
    rc = run_cli(["toy", "train", "--hybrid", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error:") and "pip install" in err[0], err
    assert not (tmp_path / "o").exists()


def test_time_budget_needs_hybrid(tmp_path, capsys):
    from process_support import run_cli

    rc = run_cli(["toy", "train", "--out", str(tmp_path / "o"), "--time-budget-s", "60"])
    assert rc == 2 and "--hybrid" in capsys.readouterr().err


def test_hybrid_training_on_a_cpu_is_refused_before_any_work(tmp_path, capsys):
    """The hybrid recipe's batches were killed for memory on a 24 GiB CPU machine after ~77 s with no error line;
    the CLI refuses a CPU device up front (exit 2) and writes nothing."""
    from process_support import run_cli

    rc = run_cli(["toy", "train", "--hybrid", "--out", str(tmp_path / "o"), "--time-budget-s", "10"])
    err = capsys.readouterr().err
    assert rc == 2 and "needs a CUDA device" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()
