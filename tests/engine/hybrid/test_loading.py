"""Loading details of hybrid / MoE checkpoints: fused expert tensors (`mlp.experts.gate_up_proj` [E, 2I, H],
`mlp.experts.down_proj` [E, H, I]) load to the same model as per-expert tensors; the conditional-generation
layout's vision tower is not needed (a checkpoint without it loads the same text model); a bfloat16
recurrent state (`mamba_ssm_dtype`) keeps speculative loops equal to AR."""

from __future__ import annotations

import re

import torch
from safetensors.torch import load_file, save_file

from hybrid_support import random_hybrid_dir
from ddtree_bench.engine.loading import load_target


def logits(target, ids):
    with torch.inference_mode():
        return target(torch.tensor(ids), torch.arange(len(ids)), target.new_cache(64), 0)[0]


def test_fused_expert_tensors_load_like_per_expert_ones(tmp_path):
    dirs = random_hybrid_dir(tmp_path / "a", "qwen3_5_moe", with_drafter=False)
    sd = load_file(str(dirs.target / "model.safetensors"))
    fused, pat = {}, re.compile(r"(.*mlp\.experts\.)(\d+)\.(gate|up|down)_proj\.weight")
    groups: dict[str, dict] = {}
    for k, v in sd.items():
        m = pat.match(k)
        if m:
            groups.setdefault(m.group(1), {})[(int(m.group(2)), m.group(3))] = v
        else:
            fused[k] = v
    for base, g in groups.items():
        E = 1 + max(e for e, _ in g)
        fused[base + "gate_up_proj"] = torch.stack([torch.cat([g[(e, "gate")], g[(e, "up")]]) for e in range(E)])
        fused[base + "down_proj"] = torch.stack([g[(e, "down")] for e in range(E)])
    save_file(fused, str(dirs.target / "model.safetensors"), metadata={"format": "pt"})
    ref = random_hybrid_dir(tmp_path / "b", "qwen3_5_moe", with_drafter=False)
    ids = list(range(3, 30))
    assert torch.equal(logits(load_target(dirs.target), ids), logits(load_target(ref.target), ids))


def test_conditional_layout_needs_no_vision_weights(tmp_path):
    dirs = random_hybrid_dir(tmp_path / "a", "qwen3_5", with_drafter=False)
    ids = list(range(3, 30))
    before = logits(load_target(dirs.target), ids)
    sd = {k: v for k, v in load_file(str(dirs.target / "model.safetensors")).items() if not k.startswith("model.visual.")}
    save_file(sd, str(dirs.target / "model.safetensors"), metadata={"format": "pt"})
    assert torch.equal(logits(load_target(dirs.target), ids), before)


def test_bfloat16_ssm_state_keeps_speculative_loops_equal_to_ar(tmp_path):
    """`mamba_ssm_dtype: bfloat16` (vLLM's knob; transformers ignores it): the state is rounded after every
    token step, in AR and per tree node alike, so DFlash and DDTree still emit AR's tokens exactly."""
    import json

    from ddtree_bench.engine.generate import Engine

    dirs = random_hybrid_dir(tmp_path / "a", "qwen3_5_text")
    cfg = json.loads((dirs.target / "config.json").read_text())
    cfg["mamba_ssm_dtype"] = "bfloat16"
    (dirs.target / "config.json").write_text(json.dumps(cfg))
    t = load_target(dirs.target)
    assert t.new_cache(8).states[0].S.dtype == torch.bfloat16
    from engine_support import RiggedProposer

    prompt = list(range(5, 40))
    ar = Engine(t).generate(prompt, "ar", max_new_tokens=32).output_ids
    rig = RiggedProposer(prompt + ar, t.cfg.vocab_size, (0, 2), block_size=16, seed=1)   # long accepted paths
    for method in ("dflash", "ddtree"):
        g = Engine(t, proposer=rig).generate(prompt, method, budget=12, max_new_tokens=32)
        assert g.output_ids == ar, method
        assert max(g.accept_lengths) > 4
