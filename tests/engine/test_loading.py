"""Loading targets and drafters from Hugging Face directories: sharded safetensors, z-lab's config
spellings and default target-layer rule, bf16/fp16 loads, and every kind of bad directory failing
with one clear `UsageError` sentence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ddtree_bench.engine.config import default_target_layer_ids, parse_draft_config, parse_target_config
from ddtree_bench.engine.generate import Engine
from ddtree_bench.engine.layers import rope_inv_freq
from ddtree_bench.engine.loading import (
    load_drafter,
    load_target,
    random_configs,
    random_pair,
    read_state_dict,
    save_hf,
    torch_dtype,
)
from ddtree_bench.errors import UsageError
from engine_support import one_torch_thread  # noqa: F401 (fixture)

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The seeded random pair written once as single-file and as 3-shard directories."""
    target, drafter = random_pair(seed=0)
    tcfg, dcfg = random_configs()
    root = tmp_path_factory.mktemp("pair")
    save_hf(target, tcfg, root / "target")
    save_hf(drafter, dcfg, root / "draft")
    save_hf(target, tcfg, root / "target3", shards=3)
    save_hf(drafter, dcfg, root / "draft3", shards=3)
    return {"target": target, "drafter": drafter, "tcfg": tcfg, "dcfg": dcfg, "root": root}


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _write_dir(d: Path, cfg, sd) -> Path:
    from safetensors.torch import save_file

    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in sd.items()}, str(d / "model.safetensors"))
    return d


# ---------------------------------------------------------------------------- good directories


def test_single_file_and_sharded_load_the_same_weights_and_tokens(saved):
    root = saved["root"]
    assert len(list((root / "target3").glob("model-*-of-00003.safetensors"))) == 3
    assert (root / "target3" / "model.safetensors.index.json").exists()
    t1, t3 = load_target(root / "target"), load_target(root / "target3")
    assert _same_weights(t1, saved["target"]) and _same_weights(t3, saved["target"])
    d1, d3 = load_drafter(root / "draft", t1.cfg), load_drafter(root / "draft3", t3.cfg)
    assert _same_weights(d1, saved["drafter"]) and _same_weights(d3, saved["drafter"])
    want = Engine(saved["target"], saved["drafter"]).generate(PROMPT, "ddtree", 16, max_new_tokens=20).output_ids
    assert Engine(t3, d3).generate(PROMPT, "ddtree", 16, max_new_tokens=20).output_ids == want


def test_drafter_tensors_with_model_prefix_load(saved, tmp_path):
    sd = {f"model.{k}": v for k, v in saved["drafter"].state_dict().items()}
    d = _write_dir(tmp_path / "draft", saved["dcfg"], sd)
    assert _same_weights(load_drafter(d, saved["target"].cfg), saved["drafter"])


def test_default_target_layer_ids_rule():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]   # Qwen3-4B/8B drafters
    assert default_target_layer_ids(64, 5) == [1, 16, 31, 46, 61]  # Qwen3.5/3.6-27B
    assert default_target_layer_ids(32, 5) == [1, 8, 15, 22, 29]
    for n in (4, 7, 36):
        assert default_target_layer_ids(n, 1) == [n // 2]


def _target36():
    tcfg, _ = random_configs()
    return parse_target_config({**tcfg, "num_hidden_layers": 36})


def test_zlab_config_spellings():
    target = _target36()
    _, base = random_configs(layers=36, draft_layers=5)
    base["dflash_config"] = {"mask_token_id": 7, "target_layer_ids": [2, 3, 5, 8, 13]}
    a = parse_draft_config(base, target)
    assert (a.block_size, a.mask_token_id, a.target_layer_ids) == (16, 7, (2, 3, 5, 8, 13))
    # block_size inside dflash_config instead of the top level
    b_cfg = {k: v for k, v in base.items() if k != "block_size"}
    b_cfg["dflash_config"] = {**base["dflash_config"], "block_size": 8}
    assert parse_draft_config(b_cfg, target).block_size == 8
    # a key serialised as null in one place and set in the other (a config class with a None default)
    nulls = {**b_cfg, "block_size": None, "mask_token_id": 9,
             "dflash_config": {**b_cfg["dflash_config"], "mask_token_id": None, "target_layer_ids": None}}
    n = parse_draft_config(nulls, target)
    assert (n.block_size, n.mask_token_id, n.target_layer_ids) == (8, 9, (1, 9, 17, 25, 33))
    # no target_layer_ids: z-lab's default rule from num_target_layers (or the target's depth)
    c_cfg = {**base, "dflash_config": {"mask_token_id": 7}}
    assert parse_draft_config(c_cfg, target).target_layer_ids == (1, 9, 17, 25, 33)
    c_cfg.pop("num_target_layers")
    assert parse_draft_config(c_cfg, target).target_layer_ids == (1, 9, 17, 25, 33)
    one = {**c_cfg, "num_hidden_layers": 1}
    assert parse_draft_config(one, target).target_layer_ids == (18,)
    # z-lab's published Qwen3-8B drafter keys, as far as the engine reads them
    zlab = {**base, "layer_types": ["full_attention"] * 5, "sliding_window": None, "use_sliding_window": False,
            "dflash_config": {"mask_token_id": 7, "target_layer_ids": [1, 9, 17, 25, 33]}}
    z = parse_draft_config(zlab, target)
    assert z.target_layer_ids == (1, 9, 17, 25, 33) and z.layer_causal == (False,) * 5 and z.layer_window == (None,) * 5


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_load(saved, dtype):
    t = load_target(saved["root"] / "target3", dtype)
    d = load_drafter(saved["root"] / "draft3", t.cfg, dtype)
    want_dt = torch_dtype(dtype)
    assert all(p.dtype == want_dt for p in list(t.parameters()) + list(d.parameters()))
    with torch.inference_mode():
        half, _ = t(torch.tensor(PROMPT), torch.arange(8), t.new_cache(8), 0)
        full, _ = saved["target"](torch.tensor(PROMPT), torch.arange(8), saved["target"].new_cache(8), 0)
    assert half.dtype == want_dt
    assert (half.float() - full).abs().max() < 0.05 * full.abs().max()
    out = Engine(t, d).generate(PROMPT, "ddtree", 16, max_new_tokens=12).output_ids
    assert len(out) == 12


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_keeps_rope_frequencies_in_fp32(saved, dtype):
    """HF's from_pretrained(dtype=bf16) keeps RoPE inverse frequencies in fp32; rounding them to
    bf16 shifts the angle at distance d by up to d * 2^-9 * freq radians (several radians at a few
    thousand tokens). The cos/sin tables must equal HF's at long positions."""
    t = load_target(saved["root"] / "target", dtype)
    d = load_drafter(saved["root"] / "draft", t.cfg, dtype)
    for rot, rope, hd in ((t.rotary, t.cfg.rope, t.cfg.head_dim), (d.rotary, d.cfg.rope, d.cfg.head_dim)):
        assert rot.inv_freq.dtype == torch.float32
        assert torch.equal(rot.inv_freq, rope_inv_freq(rope, hd))
    pos = torch.arange(0, 8192, 7)
    cos, sin = t.rotary(pos, torch_dtype(dtype))
    f = pos.double()[:, None] * rope_inv_freq(t.cfg.rope, t.cfg.head_dim).double()[None, :]
    f = torch.cat([f, f], -1)
    assert (cos.double() - f.cos()).abs().max() < 1e-2 and (sin.double() - f.sin()).abs().max() < 1e-2


def test_saved_in_bf16_loads_as_fp32(saved, tmp_path):
    save_hf(saved["target"], saved["tcfg"], tmp_path / "t", dtype="bfloat16")
    t = load_target(tmp_path / "t", "float32")
    assert t.lm_head.weight.dtype == torch.float32
    assert torch.equal(t.lm_head.weight, saved["target"].lm_head.weight.to(torch.bfloat16).float())


# ---------------------------------------------------------------------------- bad directories


def _expect(match: str, fn, *args, **kw) -> UsageError:
    with pytest.raises(UsageError, match=match) as e:
        fn(*args, **kw)
    assert "\n" not in str(e.value), "one sentence, one line"
    return e.value


def test_missing_or_not_a_directory(tmp_path):
    _expect("does not exist", load_target, tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    _expect("not a directory", load_target, tmp_path / "file")
    (tmp_path / "empty").mkdir()
    _expect("has no config.json", load_target, tmp_path / "empty")


@pytest.mark.parametrize("text,match", [
    ("{not json", "malformed JSON"),
    ("[1, 2]", "expected a JSON object"),
    ("\xff\xfe", "malformed JSON"),
])
def test_malformed_config_json(saved, tmp_path, text, match):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_bytes(text.encode("latin-1"))
    _expect(match, load_target, d)


@pytest.mark.parametrize("change,match", [
    ({"model_type": "mistral"}, "not supported"),
    ({"hidden_size": None}, "has no 'hidden_size'"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"hidden_size": "sixty-four"}, "hidden_size"),
    ({"num_attention_heads": 0}, "num_attention_heads"),
    ({"vocab_size": [64]}, "vocab_size"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
    ({"rope_scaling": {"rope_type": "llama3"}}, "rope"),
    ({"rope_scaling": "llama3"}, "rope"),
])
def test_malformed_target_config_values(saved, tmp_path, change, match):
    cfg = {**saved["tcfg"], **change}
    d = _write_dir(tmp_path / "t", cfg, saved["target"].state_dict())
    _expect(match, load_target, d)


@pytest.mark.parametrize("change,match", [
    ({"dflash_config": {"mask_token_id": 64, "target_layer_ids": [1, 2]}}, "outside the target vocabulary"),
    ({"dflash_config": {"mask_token_id": -1, "target_layer_ids": [1, 2]}}, "outside the target vocabulary"),
    ({"dflash_config": {"mask_token_id": 63, "target_layer_ids": [1, 4]}}, "outside the target's 4 layers"),
    ({"dflash_config": {"mask_token_id": 63, "target_layer_ids": [-1, 2]}}, "outside the target's"),
    ({"dflash_config": {"mask_token_id": 63, "target_layer_ids": []}}, "empty"),
    ({"dflash_config": {"target_layer_ids": [1, 2]}}, "mask_token_id"),
    ({"dflash_config": {"mask_token_id": 63, "target_layer_ids": "1,2"}}, "target_layer_ids"),
    ({"dflash_config": {"mask_token_id": "mask", "target_layer_ids": [1, 2]}}, "mask_token_id"),
    ({"dflash_config": [63]}, "dflash_config"),
    ({"block_size": None}, "block_size"),
    ({"block_size": 1}, "block_size must be >= 2"),
    ({"hidden_size": 32}, "differs from the target"),
    ({"layer_types": ["sliding_attention", "full_attention"]}, "sliding_window is not set"),
    ({"layer_types": ["full_attention"]}, "1 entries for 2 layers"),
])
def test_bad_drafter_config(saved, tmp_path, change, match):
    cfg = {**saved["dcfg"], **change}
    d = _write_dir(tmp_path / "d", cfg, saved["drafter"].state_dict())
    _expect(match, load_drafter, d, saved["target"].cfg)


@pytest.mark.parametrize("damage", ["truncated", "header-only", "empty", "garbage", "bad-header-json"])
def test_corrupt_or_truncated_safetensors(saved, tmp_path, damage):
    d = _write_dir(tmp_path / "t", saved["tcfg"], saved["target"].state_dict())
    f = d / "model.safetensors"
    b = f.read_bytes()
    f.write_bytes({
        "truncated": b[: len(b) // 2],
        "header-only": b[:20],
        "empty": b"",
        "garbage": bytes(range(256)) * 20,
        "bad-header-json": b[:8] + b"{" * 10 + b[18:],
    }[damage])
    _expect("corrupt or truncated", load_target, d)


def test_weight_problems(saved, tmp_path):
    sd = dict(saved["target"].state_dict())
    t = tmp_path
    _expect("has no model.safetensors", load_target, (lambda p: (p.mkdir(), (p / "config.json").write_text(json.dumps(saved["tcfg"])), p)[2])(t / "noweights"))
    missing = {k: v for k, v in sd.items() if k != "model.layers.1.mlp.up_proj.weight"}
    _expect(r"lack 1 tensor\(s\), e\.g\. model\.layers\.1\.mlp\.up_proj\.weight", load_target, _write_dir(t / "missing", saved["tcfg"], missing))
    bad = {**sd, "model.norm.weight": torch.ones(65)}
    _expect(r"model\.norm\.weight has shape \(65,\)", load_target, _write_dir(t / "shape", saved["tcfg"], bad))
    nan = {**sd, "lm_head.weight": sd["lm_head.weight"].clone().fill_(float("nan"))}
    _expect("NaN or inf", load_target, _write_dir(t / "nan", saved["tcfg"], nan))
    untied = {k: v for k, v in sd.items() if k != "lm_head.weight"}  # an untied model needs its head
    _expect("lm_head.weight", load_target, _write_dir(t / "nohead", saved["tcfg"], untied))
    tied = load_target(_write_dir(t / "tied", {**saved["tcfg"], "tie_word_embeddings": True}, untied))
    assert tied.lm_head.weight.data_ptr() == tied.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.int8])
def test_quantized_weights_are_refused(saved, tmp_path, dtype):
    """An FP8 / int8 checkpoint (e.g. Qwen3-8B-FP8 with weight_scale_inv) must not load as if its
    raw codes were weights: fp8 crashed with NotImplementedError, int8 loaded silently as garbage."""
    sd = dict(saved["target"].state_dict())
    w = sd["model.layers.0.mlp.up_proj.weight"]
    sd["model.layers.0.mlp.up_proj.weight"] = (w * 100).to(dtype) if dtype == torch.int8 else w.to(dtype)
    sd["model.layers.0.mlp.up_proj.weight_scale_inv"] = torch.ones(1)
    err = _expect("model.layers.0.mlp.up_proj.weight", load_target, _write_dir(tmp_path / "q", saved["tcfg"], sd))
    assert str(dtype).removeprefix("torch.") in str(err) and "quantized" in str(err)


def test_broken_shard_index(saved, tmp_path):
    import shutil

    d = tmp_path / "t3"
    shutil.copytree(saved["root"] / "target3", d)
    (d / "model-00002-of-00003.safetensors").unlink()
    _expect("model-00002-of-00003.safetensors named in model.safetensors.index.json are missing", load_target, d)
    (d / "model.safetensors.index.json").write_text('{"weights": {}}')
    _expect("malformed shard index", load_target, d)
    (d / "model.safetensors.index.json").write_text("{oops")
    _expect("malformed shard index", load_target, d)
    _expect("pytorch_model.bin", read_state_dict, (lambda p: (p.mkdir(), (p / "pytorch_model.bin").write_bytes(b"x"), p)[2])(tmp_path / "bin"), "model")


def test_unknown_dtype_and_device(saved):
    _expect("unknown dtype 'float8'", load_target, saved["root"] / "target", "float8")
    if not torch.cuda.is_available():
        _expect("CUDA is not available", load_target, saved["root"] / "target", "float32", "cuda")
