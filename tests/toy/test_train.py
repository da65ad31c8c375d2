"""The toy training code: its batched forwards agree with the engine's, and a tiny run writes a
loadable HF pair (the committed pair is made by the same code with the default Recipe)."""

from __future__ import annotations

import json

import pytest
import torch

from ddtree_bench.engine.config import parse_draft_config, parse_target_config
from ddtree_bench.engine.draft import DFlashDrafter
from ddtree_bench.engine.generate import DFlashProposer, Engine
from ddtree_bench.engine.model import Target
from ddtree_bench.toy import tokenizer as btok
from ddtree_bench.toy.train import Recipe, draft_config, draft_forward, greedy_continue, lm_forward, target_config

TINY = Recipe(hidden=64, layers=3, heads=4, kv_heads=2, intermediate=128, seq_len=128, target_batch=4, target_steps=3,
              distill_contexts=12, distill_new_tokens=24, distill_batch=8, draft_layers=2, draft_intermediate=96,
              target_layer_ids=(0, 2), draft_batch=4, anchors_per_seq=3, draft_steps=3, warmup_steps=1)


def _models(seed=0):
    torch.manual_seed(seed)
    target = Target(parse_target_config(target_config(TINY)))
    drafter = DFlashDrafter(parse_draft_config(draft_config(TINY), target.cfg))
    with torch.no_grad():
        for m in (target, drafter):
            for p in m.parameters():
                p.normal_(0, 0.3 if p.dim() >= 2 else 1.0)
    return target.eval(), drafter.eval()


def test_lm_forward_matches_engine_forward():
    target, _ = _models()
    ids = torch.randint(0, btok.VOCAB_SIZE, (2, 40))
    logits, hidden = lm_forward(target, ids, hidden_layers=(0, 2))
    for b in range(2):
        ref, ref_h = target(ids[b], torch.arange(40), target.new_cache(64), 0, hidden_layers=(0, 2))
        assert torch.allclose(logits[b], ref, atol=1e-4)
        assert torch.allclose(hidden[b], ref_h, atol=1e-4)


def test_left_padding_is_invisible():
    target, _ = _models(1)
    a = torch.randint(0, btok.VOCAB_SIZE, (1, 30))
    padded = torch.cat([torch.full((1, 7), btok.ENDOFTEXT), a], 1)
    ref = greedy_continue(target, a, 12)
    got = greedy_continue(target, padded, 12, pad_left=torch.tensor([7]))
    assert torch.equal(ref, got)


def test_greedy_continue_equals_engine_ar():
    target, _ = _models(2)
    ctx = torch.randint(0, btok.VOCAB_SIZE, (3, 25))
    cont = greedy_continue(target, ctx, 20)
    eng = Engine(target)
    for b in range(3):
        g = eng.generate(ctx[b].tolist(), "ar", max_new_tokens=20)
        assert g.output_ids == cont[b].tolist()


def test_draft_forward_equals_engine_drafter():
    """Training sees, for a block at anchor a, exactly what the engine's drafter sees at inference."""
    target, drafter = _models(3)
    T = 60
    ids = torch.randint(0, btok.VOCAB_SIZE, (1, T))
    with torch.no_grad():
        _, feats = lm_forward(target, ids, hidden_layers=TINY.target_layer_ids)
        anchors = torch.tensor([[5, 23, 40]])
        got = draft_forward(drafter, target.model.embed_tokens, target.lm_head, feats, ids, anchors)[0]  # [k, 15, V]
        prop = DFlashProposer(drafter, target)
        for j, a in enumerate(anchors[0].tolist()):
            ref = prop.propose(feats[0, :a], int(ids[0, a]), drafter.new_cache(128), 0, a)
            assert torch.allclose(got[j], ref, atol=1e-4), j


def test_tiny_training_run_writes_a_loadable_pair(tmp_path):
    from ddtree_bench.pair import load_pair
    from ddtree_bench.toy.train import train

    train(TINY, tmp_path / "pair", device="cpu", max_files=20, log=lambda m: None)
    tdir, ddir = tmp_path / "pair" / "target", tmp_path / "pair" / "draft"
    cfg = json.loads((ddir / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["block_size"] == 16
    assert cfg["dflash_config"] == {"mask_token_id": btok.MASK, "target_layer_ids": [0, 2]}
    from safetensors import safe_open

    with safe_open(str(ddir / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {n.split(".")[0] for n in names} == {"fc", "hidden_norm", "layers", "norm"}
    gen = json.loads((tdir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [btok.IM_END, btok.ENDOFTEXT]
    pair = load_pair(str(tdir), str(ddir), "ddtree")
    prompt = pair.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    a = pair.engine.generate(prompt, "ar", max_new_tokens=20, stop_ids=pair.stop_ids)
    d = pair.engine.generate(prompt, "ddtree", budget=16, max_new_tokens=20, stop_ids=pair.stop_ids)
    assert a.output_ids == d.output_ids


def test_draft_anchors_keep_every_label_inside_the_greedy_part_and_the_loss_reads_them():
    from ddtree_bench.toy.train import draft_anchors, draft_loss

    starts, ends, bs = torch.tensor([1, 5, 30]), torch.tensor([40, 21, 46]), 16
    a = draft_anchors(starts, ends, bs, 64, torch.Generator().manual_seed(0), torch.device("cpu"))
    assert a.shape == (3, 64)
    assert bool((a >= (starts - 1).clamp(min=1)[:, None]).all()) and bool((a + bs - 1 < ends[:, None]).all())
    assert {int(a[1].min()), int(a[1].max())} == {4, 5}     # a one-token-wide span: both ends are drawn
    ids = torch.arange(3 * 48).view(3, 48)
    logits = torch.full((3, 64, bs - 1, 3 * 48), -30.0)
    loss, labels = draft_loss(logits, ids, a, torch.ones(bs - 1))
    assert bool((labels == ids.gather(1, a)[:, :, None] + torch.arange(1, bs)).all())
    logits.scatter_(-1, labels[..., None], 30.0)            # every label predicted with near certainty
    assert float(draft_loss(logits, ids, a, torch.ones(bs - 1))[0]) < 1e-6 < float(loss)


def test_a_small_corpus_samples_only_sources_long_enough_and_says_when_none_is():
    """`toy train --max-files 2` ('quick trials') was an internal error, ValueError: high <= 0, from a source shorter
    than a training window; a corpus whose prompts are all too long made the distillation loop spin forever."""
    from types import SimpleNamespace

    import numpy as np

    from ddtree_bench.errors import UsageError
    from ddtree_bench.toy.train import Sampler

    corpus = SimpleNamespace(weights={"short": 1.0, "long": 1.0},
                             streams={"short": np.arange(10), "long": np.arange(1000)},
                             prompts={"short": [np.arange(500)], "long": []})
    s = Sampler(corpus, seed=0)
    w = s.windows(64, 100)
    assert w.shape == (64, 100) and (w[:, 1:] - w[:, :-1] == 1).all() and w.max() < 1000
    assert not s.has_prompt(100) and s.has_prompt(500)
    with pytest.raises(UsageError, match="longest source has 1000 tokens, a training window needs 2001"):
        s.windows(1, 2000)
