"""Resolving `--model` / `--draft` into a ready engine, tokenizer and stop ids.

Built-in names: `toy` (the bundled trained pair in ddtree_bench/models/toy), `toy-hybrid` (the
bundled trained hybrid pair in ddtree_bench/models/toy-hybrid: a Qwen3.5-style Gated DeltaNet +
attention target and its DFlash drafter) and `random` (a seeded random tiny pair built in memory,
with the toy's byte tokenizer; useful only for losslessness checks, since its drafter accepts almost
nothing). Anything else is a Hugging Face directory; the drafter is then `--draft DIR`, and `ar`
needs none.

Knows models and tokenizers; knows nothing of suites, HTTP or results.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddtree_bench.errors import UsageError

PACKAGE_DIR = Path(__file__).resolve().parent
TOY_DIR = PACKAGE_DIR / "models" / "toy"
TOY_HYBRID_DIR = PACKAGE_DIR / "models" / "toy-hybrid"
BUNDLED = {"toy": TOY_DIR, "toy-hybrid": TOY_HYBRID_DIR}   # built-in name -> directory holding target/ and draft/
BUILTIN = ("toy", "toy-hybrid", "random")


@dataclass
class LoadedPair:
    engine: Any                  # engine.generate.Engine
    tokenizer: Any               # tokenizer.ChatTokenizer
    stop_ids: list[int]
    info: dict[str, Any] = field(default_factory=dict)  # for run.json: names, paths, hashes, dtype, device


def model_dirs(model: str, draft: str | None) -> tuple[Path | None, Path | None]:
    """(target dir, draft dir) for a --model / --draft pair; None dirs for the in-memory `random`."""
    if model == "random":
        return None, None
    if model in BUNDLED:
        pair_dir = BUNDLED[model]
        target_dir = pair_dir / "target"
        if not (target_dir / "config.json").exists():
            raise UsageError(f"the bundled {model} pair is missing from this installation", hint="reinstall ddtree-bench or pass --model DIR")
        return target_dir, Path(draft) if draft else pair_dir / "draft"
    return Path(model).expanduser(), Path(draft).expanduser() if draft else None


def load_pair(model: str, draft: str | None, method: str, dtype: str = "float32", device: str = "cpu",
              fast: bool | None = None, cuda_graphs: bool = False) -> LoadedPair:
    """Load the target (and the drafter when `method` needs one) and the tokenizer."""
    from ddtree_bench.engine.generate import Engine
    from ddtree_bench.engine.loading import dir_hash, load_drafter, load_target, random_pair, resolve_device
    from ddtree_bench.tokenizer import ChatTokenizer, generation_stop_ids

    resolve_device(device)
    target_dir, draft_dir = model_dirs(model, draft)
    info: dict[str, Any] = {"model": model, "draft": draft, "dtype": dtype, "device": device, "cuda_graphs": cuda_graphs}
    if target_dir is None:
        from ddtree_bench.toy.tokenizer import IM_END, VOCAB_SIZE

        target, drafter = random_pair(seed=0, dtype=dtype, device=device, vocab_size=VOCAB_SIZE)
        tok = ChatTokenizer(TOY_DIR / "target")  # the same byte tokenizer the toy pair ships
        info.update(model_path=None, model_hash="random-seed-0", draft_path=None, draft_hash="random-seed-0")
        engine = Engine(target, drafter if method != "ar" else None, fast=fast, cuda_graphs=cuda_graphs)
        return LoadedPair(engine, tok, [IM_END], info)

    target = load_target(target_dir, dtype, device)
    tok = ChatTokenizer(target_dir)
    drafter = None
    if method != "ar":
        if draft_dir is None:
            raise UsageError(f"--method {method} needs a drafter", hint="pass --draft DIR (a z-lab DFlash checkpoint)")
        drafter = load_drafter(draft_dir, target.cfg, dtype, device)
    info.update(
        model_path=str(target_dir),
        model_hash=dir_hash(target_dir),
        draft_path=str(draft_dir) if draft_dir else None,
        draft_hash=dir_hash(draft_dir) if (draft_dir and method != "ar") else None,
    )
    if drafter is not None:
        info.update(block_size=drafter.block_size, mask_token_id=drafter.mask_token_id,
                    target_layer_ids=list(drafter.target_layer_ids))
    engine = Engine(target, drafter, fast=fast, cuda_graphs=cuda_graphs)
    return LoadedPair(engine, tok, generation_stop_ids(target_dir, tok), info)
