"""Reading a Hugging Face directory's safetensors and putting them into a module, checked: the weight files (one
file or the shards an index names), the state dict, and `load_into`, which refuses missing, misshapen, quantized
(int8 / fp8 codes) or non-finite tensors with one `UsageError` sentence each.

Shared by the dense loader (loading.py) and the hybrid one (hybrid/loading.py); knows nothing of configs or
model classes.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from ddtree_bench.errors import UsageError


def weight_files(model_dir: Path, what: str) -> list[Path]:
    """The safetensors files of a directory: a single file, or the shards named by the index."""
    model_dir = Path(model_dir)
    single = model_dir / "model.safetensors"
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise UsageError(f"{index}: malformed shard index ({e})") from None
        files = sorted({model_dir / f for f in weight_map.values()})
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise UsageError(f"{what}: shard(s) {', '.join(missing[:3])} named in {index.name} are missing")
        return files
    if single.exists():
        return [single]
    if (model_dir / "pytorch_model.bin").exists():
        raise UsageError(f"{what}: {model_dir} has only pytorch_model.bin; convert it to safetensors first")
    raise UsageError(f"{what}: {model_dir} has no model.safetensors or model.safetensors.index.json")


def read_state_dict(model_dir: Path, what: str) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    sd: dict[str, torch.Tensor] = {}
    for f in weight_files(model_dir, what):
        try:
            sd.update(load_file(str(f)))
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise UsageError(f"{what}: cannot read {f} - corrupt or truncated safetensors ({e})") from None
    return sd


def load_into(module: nn.Module, sd: dict[str, torch.Tensor], what: str, ignore_missing: tuple[str, ...] = ()) -> None:
    expected = module.state_dict()
    missing = [k for k in expected if k not in sd and k not in ignore_missing]
    if missing:
        raise UsageError(f"{what}: weights lack {len(missing)} tensor(s), e.g. {', '.join(missing[:3])}")
    for k, v in expected.items():
        if k in sd and tuple(sd[k].shape) != tuple(v.shape):
            raise UsageError(f"{what}: tensor {k} has shape {tuple(sd[k].shape)}, config says {tuple(v.shape)}")
        if k in sd and (not sd[k].is_floating_point() or sd[k].dtype.itemsize < 2):  # int8 / fp8 codes are not weights
            dt = str(sd[k].dtype).removeprefix("torch.")
            raise UsageError(f"{what}: tensor {k} is {dt}; quantized checkpoints are not supported (need float32, bfloat16 or float16 weights)")
    for k, t in sd.items():
        if k in expected and t.is_floating_point() and not torch.isfinite(t).all():
            raise UsageError(f"{what}: tensor {k} contains NaN or inf")
    module.load_state_dict({k: v for k, v in sd.items() if k in expected}, strict=False)
