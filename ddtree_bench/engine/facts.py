"""Facts about a loaded pair that change what a run measures, for run.json: the drafter's attention
mode (full / sliding window, causal or not, per layer) and the rule that chose the stop ids.

Both matter when a run is compared with another implementation: the DFlash authors' drafters may
use sliding-window layers (a deployment that ignores the window drafts differently, which lowers
tau but never breaks losslessness), and the DDTree authors' benchmark stops on the tokenizer's eos
token only, while ddtree-bench by default stops on generation_config.json's eos list (a stop that
ends one run early and not the other shifts both outputs and tau). Knows config files and the
engine's configs; nothing of suites, HTTP or results.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STOP_RULES = ("--stop-ids", "generation_config.json eos_token_id", "config.json eos_token_id", "tokenizer eos_token",
              "none")


def drafter_attention(layer_causal, layer_window) -> dict[str, Any]:
    """{'mode': 'full' | 'sliding' | 'mixed', 'layers': [{'causal', 'window'}...]} from a DraftConfig's
    per-layer tuples (window None = full attention over context + block)."""
    layers = [{"causal": bool(c), "window": w} for c, w in zip(layer_causal, layer_window)]
    windows = {l["window"] is not None for l in layers}
    mode = "mixed" if len(windows) > 1 else ("sliding" if windows == {True} else "full")
    return {"mode": mode, "layers": layers}


def drafter_attention_from_dir(draft_dir: Path) -> dict[str, Any] | None:
    """The same from a drafter directory's config.json (None when it cannot be read): layer_types,
    sliding_window and is_causal, read as engine/config.parse_draft_config reads them."""
    try:
        cfg = json.loads((Path(draft_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    n = int(cfg.get("num_hidden_layers") or 0)
    types = cfg.get("layer_types") or ["full_attention"] * n
    window = cfg.get("sliding_window")
    causal = [bool(cfg["is_causal"]) if "is_causal" in cfg else t == "sliding_attention" for t in types]
    windows = [window if t == "sliding_attention" else None for t in types]
    return drafter_attention(causal, windows)


def stop_id_rule(model_dir: Path | None, explicit: list[int] | None, tokenizer_eos_id: int | None) -> dict[str, Any]:
    """Which rule gave the stop ids (tokenizer.generation_stop_ids' order), and the tokenizer's own eos
    id, which is all the DDTree authors' benchmark stops on."""
    rule = "none"
    if explicit is not None:
        rule = "--stop-ids"
    else:
        for name in ("generation_config.json", "config.json"):
            p = Path(model_dir) / name if model_dir is not None else None
            if p is not None and p.exists():
                try:
                    eos = json.loads(p.read_text(encoding="utf-8")).get("eos_token_id")
                except ValueError:
                    eos = None
                if eos is not None:
                    rule = f"{name} eos_token_id"
                    break
        else:
            if tokenizer_eos_id is not None:
                rule = "tokenizer eos_token"
    return {"rule": rule, "tokenizer_eos_id": tokenizer_eos_id,
            "authors_rule": "the DDTree authors' benchmark stops on the tokenizer's eos token only"}


def run_facts(spec, backend) -> dict[str, Any]:
    """run.json's `drafter_attention` and `stop_id_rule` for a RunSpec and its backend (the in-process
    engine's own drafter config when the backend holds one, else the drafter directory's)."""
    from ddtree_bench.pair import model_dirs

    facts: dict[str, Any] = {"drafter_attention": None, "stop_id_rule": None}
    pair = getattr(backend, "pair", None)
    engine = getattr(pair, "engine", None)
    drafter = getattr(engine, "drafter", None)
    try:
        target_dir, draft_dir = model_dirs(spec.model, spec.draft)
    except Exception:  # a bad --model is reported by the backend, not here
        target_dir, draft_dir = None, None
    if drafter is not None:
        facts["drafter_attention"] = drafter_attention(drafter.cfg.layer_causal, drafter.cfg.layer_window)
    elif draft_dir is not None and spec.method != "ar":
        facts["drafter_attention"] = drafter_attention_from_dir(draft_dir)
    tok = getattr(pair, "tokenizer", None)
    eos = getattr(tok, "eos_token_id", None)
    if tok is None and target_dir is not None and (Path(target_dir) / "tokenizer_config.json").exists():
        try:
            cfg = json.loads((Path(target_dir) / "tokenizer_config.json").read_text(encoding="utf-8"))
            eos = cfg.get("eos_token") if isinstance(cfg.get("eos_token"), int) else None
        except ValueError:
            eos = None
    facts["stop_id_rule"] = stop_id_rule(target_dir, getattr(spec, "stop_ids", None), eos)
    return facts
