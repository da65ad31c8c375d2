"""Classic drafter config faults, caught from files alone (no model is loaded).

A DFlash drafter config can disagree with its own checkpoint or with its target, and nothing
errors: acceptance just falls (the product's team once ran at 1.1 tokens a round for days on a
guessed `mask_token_id` and `target_layer_ids`). Checked here:
  * `target_layer_ids`: present (else the default rule is used: say so), in range, unique, and
    as many as `fc.weight` takes (fc in-features = len(ids) x target hidden size);
  * `mask_token_id`: present, inside the target vocabulary, not the target's eos/pad/bos id;
  * `layer_types`: one per checkpoint layer (`layers.N.*` tensors), known names, a window for
    sliding layers; `num_hidden_layers` equal to the checkpoint's layer count;
  * shapes: hidden size vs the target's, q/k/v projections vs heads x head_dim;
  * `num_target_layers`, RoPE theta and vocabulary size vs the target's.
`diff_configs` compares the drafter a server was launched with against the reference's and maps
each difference to the `DraftVariant` it amounts to.
Knows config.json and safetensors headers; nothing of engines or servers.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Finding:
    severity: str            # "error" (acceptance will suffer or the pair cannot run) | "warning" | "info"
    code: str                # stable name, e.g. "layer_ids_vs_fc"
    message: str
    variant: str | None = None   # the DraftVariant name this amounts to, where there is one

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def safetensors_shapes(model_dir: Path) -> dict[str, list[int]]:
    """{tensor name: shape} from the safetensors headers of a directory (single file or shards)."""
    model_dir = Path(model_dir)
    files = sorted(model_dir.glob("*.safetensors"))
    shapes: dict[str, list[int]] = {}
    for f in files:
        with open(f, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                continue
            (n,) = struct.unpack("<Q", head)
            if n > 100 * 1024 * 1024:
                continue
            try:
                meta = json.loads(fh.read(n))
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
        for name, info in meta.items():
            if name != "__metadata__" and isinstance(info, dict) and isinstance(info.get("shape"), list):
                shapes[name] = info["shape"]
    return shapes


def _read(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return obj if isinstance(obj, dict) else {}


def _dflash(cfg: dict[str, Any], key: str) -> Any:
    d = cfg.get("dflash_config") or {}
    v = d.get(key) if isinstance(d, dict) else None
    return cfg.get(key) if v is None else v


def _ids(v: Any) -> list[int] | None:
    return [int(i) for i in v] if isinstance(v, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) for i in v) else None


def _strip(name: str) -> str:
    return name[len("model."):] if name.startswith("model.") else name


def check_pair(draft_dir: Path, target_dir: Path) -> list[Finding]:
    """Every config fault found in a drafter directory against its target directory."""
    out: list[Finding] = []
    dc, tc = _read(draft_dir), _read(target_dir)
    if not dc:
        return [Finding("error", "draft_config", f"{draft_dir}/config.json is missing or not a JSON object")]
    if not tc:
        return [Finding("error", "target_config", f"{target_dir}/config.json is missing or not a JSON object")]
    shapes = {_strip(k): v for k, v in safetensors_shapes(draft_dir).items()}
    t_layers, t_hidden, t_vocab = tc.get("num_hidden_layers"), tc.get("hidden_size"), tc.get("vocab_size")

    # target_layer_ids
    ids = _ids(_dflash(dc, "target_layer_ids"))
    if _dflash(dc, "target_layer_ids") is None:
        out.append(Finding("warning", "layer_ids_missing",
                           "the drafter config has no dflash_config.target_layer_ids: engines fall back to z-lab's default rule, "
                           "which is right only if the drafter was trained with it"))
    elif ids is None:
        out.append(Finding("error", "layer_ids_type", f"target_layer_ids {_dflash(dc, 'target_layer_ids')!r} is not a list of integers"))
    if ids is not None and isinstance(t_layers, int):
        bad = [i for i in ids if not 0 <= i < t_layers]
        if bad:
            out.append(Finding("error", "layer_ids_range", f"target_layer_ids {ids} has {bad} outside the target's {t_layers} layers (0-based)"))
        if len(set(ids)) != len(ids):
            out.append(Finding("warning", "layer_ids_duplicate", f"target_layer_ids {ids} repeats a layer"))
    fc = shapes.get("fc.weight")
    if ids is not None and fc is not None and isinstance(t_hidden, int) and len(fc) == 2 and t_hidden:
        n_feat = fc[1] / t_hidden
        if n_feat != len(ids):
            out.append(Finding("error", "layer_ids_vs_fc",
                               f"target_layer_ids has {len(ids)} entries but fc.weight {fc} takes {fc[1]} = "
                               f"{n_feat:g} x hidden {t_hidden} features: the config does not belong to this checkpoint"))
    n_target = dc.get("num_target_layers")
    if isinstance(n_target, int) and isinstance(t_layers, int) and n_target != t_layers:
        out.append(Finding("warning", "num_target_layers", f"num_target_layers {n_target} differs from the target's {t_layers} layers"))

    # mask_token_id
    mask = _dflash(dc, "mask_token_id")
    if mask is None:
        out.append(Finding("error", "mask_missing", "the drafter config has no dflash_config.mask_token_id: an engine must guess it"))
    elif not isinstance(mask, int) or isinstance(mask, bool):
        out.append(Finding("error", "mask_type", f"mask_token_id {mask!r} is not an integer"))
    else:
        if isinstance(t_vocab, int) and not 0 <= mask < t_vocab:
            out.append(Finding("error", "mask_range", f"mask_token_id {mask} is outside the target vocabulary (size {t_vocab})"))
        specials = {k: tc.get(k) for k in ("eos_token_id", "pad_token_id", "bos_token_id")}
        for k, v in specials.items():
            vs = v if isinstance(v, list) else [v]
            if mask in [x for x in vs if isinstance(x, int)]:
                out.append(Finding("warning", "mask_is_special",
                                   f"mask_token_id {mask} equals the target's {k}: z-lab drafters use a dedicated, otherwise unused id",
                                   f"mask_id={mask}"))
    d_vocab = dc.get("vocab_size")
    if isinstance(d_vocab, int) and isinstance(t_vocab, int) and d_vocab != t_vocab:
        out.append(Finding("warning", "vocab_size", f"drafter vocab_size {d_vocab} differs from the target's {t_vocab}"))

    # layers and layer types
    n_layers = dc.get("num_hidden_layers")
    ckpt_layers = sorted({int(m[1]) for k in shapes if (m := re.match(r"layers\.(\d+)\.", k))})
    if shapes and isinstance(n_layers, int) and ckpt_layers and len(ckpt_layers) != n_layers:
        out.append(Finding("error", "num_layers", f"num_hidden_layers {n_layers} but the checkpoint has {len(ckpt_layers)} layers"))
    types = dc.get("layer_types")
    n_ck = len(ckpt_layers) if ckpt_layers else n_layers
    if types is not None:
        if not isinstance(types, list) or (isinstance(n_ck, int) and len(types) != n_ck):
            out.append(Finding("error", "layer_types_len", f"layer_types has {len(types) if isinstance(types, list) else '?'} entries for {n_ck} layers"))
        elif any(t not in ("full_attention", "sliding_attention") for t in types):
            out.append(Finding("warning", "layer_types_names", f"layer_types {types} has names other than full_attention / sliding_attention"))
        if isinstance(types, list) and "sliding_attention" in types and not (dc.get("sliding_window") or _dflash(dc, "swa_window_size")):
            out.append(Finding("error", "sliding_window_missing", "layer_types has sliding_attention but no sliding_window: engines run those layers as full attention",
                               "no_sliding_window"))

    # shapes
    hidden = dc.get("hidden_size")
    if isinstance(hidden, int) and isinstance(t_hidden, int) and hidden != t_hidden:
        out.append(Finding("error", "hidden_size", f"drafter hidden_size {hidden} differs from the target's {t_hidden}"))
    heads, kv = dc.get("num_attention_heads"), dc.get("num_key_value_heads") or dc.get("num_attention_heads")
    hd = dc.get("head_dim") or (hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None)
    for name, want in (("q_proj", heads), ("k_proj", kv), ("v_proj", kv)):
        sh = shapes.get(f"layers.0.self_attn.{name}.weight")
        if sh and isinstance(want, int) and isinstance(hd, int) and sh[0] != want * hd:
            out.append(Finding("error", f"{name}_shape", f"layers.0.self_attn.{name}.weight {sh} does not fit {want} heads x head_dim {hd}"))
    d_theta, t_theta = _theta(dc), _theta(tc)
    if d_theta is not None and t_theta is not None and d_theta != t_theta:
        out.append(Finding("info", "rope_theta", f"drafter rope_theta {d_theta:g} differs from the target's {t_theta:g} (fine if it was trained so)"))
    return out


def _theta(cfg: dict[str, Any]) -> float | None:
    p = cfg.get("rope_parameters")
    v = p.get("rope_theta") if isinstance(p, dict) else None
    v = cfg.get("rope_theta") if v is None else v
    return float(v) if isinstance(v, (int, float)) else None


def diff_configs(reference_dir: Path, server_dir: Path) -> list[Finding]:
    """Differences between the reference's drafter config and the one a server was launched with,
    each named by the DraftVariant it amounts to."""
    a, b = _read(reference_dir), _read(server_dir)
    out: list[Finding] = []
    ia, ib = _ids(_dflash(a, "target_layer_ids")), _ids(_dflash(b, "target_layer_ids"))
    if ia != ib:
        off = {y - x for x, y in zip(ia or [], ib or [])}
        name = f"layer_ids{next(iter(off)):+d}" if ia and ib and len(ia) == len(ib) and len(off) == 1 else None
        out.append(Finding("error", "server_layer_ids", f"the server's drafter takes target_layer_ids {ib}, the reference's {ia}", name))
    ma, mb = _dflash(a, "mask_token_id"), _dflash(b, "mask_token_id")
    if ma != mb:
        out.append(Finding("error", "server_mask_id", f"the server's drafter feeds mask id {mb}, the reference's {ma}",
                           f"mask_id={mb}" if isinstance(mb, int) else None))
    ca, cb = a.get("is_causal", _dflash(a, "causal")), b.get("is_causal", _dflash(b, "causal"))
    if ca != cb:
        out.append(Finding("error", "server_causal", f"the server's drafter sets is_causal={cb}, the reference's {ca}",
                           "causal" if cb else ("bidirectional" if cb is False else None)))
    for key in ("layer_types", "sliding_window", "block_size", "num_hidden_layers"):
        va, vb = a.get(key), b.get(key)
        if va != vb:
            variant = f"sliding_window={vb}" if key == "sliding_window" and isinstance(vb, int) else None
            out.append(Finding("error" if key != "block_size" else "warning", f"server_{key}",
                               f"the server's drafter has {key}={vb!r}, the reference's {va!r}", variant))
    return out
