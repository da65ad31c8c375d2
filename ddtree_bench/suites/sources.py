"""Raw items of a suite's source: a bundled/local JSONL file, or a Hugging Face dataset.

Bundled files live in `ddtree_bench/data/` (gsm8k test, HumanEval, MT-Bench questions, a ShareGPT
sample; provenance in `ddtree_bench/data/README.md`) and need nothing else. Other suites load
through HF `datasets` (the optional extra `ddtree-bench[datasets]`); when `datasets` is missing,
or the hub is unreachable and the dataset is not in the local HF cache, loading fails with one
`UsageError` line, never a traceback or a long hang: reachability is probed first with a short
timeout, and an unreachable hub switches `datasets` to offline mode (cache only) for the call.
Knows nothing of templates, subsets or models.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ddtree_bench.errors import UsageError
from ddtree_bench.jsonl import iter_jsonl
from ddtree_bench.suites.spec import Source

DATA_DIR = Path(__file__).resolve().parent.parent / "data"   # ddtree_bench/data/
HUB_PROBE_TIMEOUT_S = 3.0
_TRUE = {"1", "ON", "YES", "TRUE"}
_OFFLINE_HINT = ("use a bundled suite (gsm8k, humaneval, mt-bench, sharegpt, chat-mix) or a JSONL file of "
                 "{\"id\", \"turns\"}; or run once where the hub is reachable to fill the HF cache")


def resolve_file(file: str, base_dir: Path | None) -> Path:
    """A source file: absolute, relative to the suite YAML's directory, or bundled in DATA_DIR."""
    p = Path(file).expanduser()
    if p.is_absolute():
        return p
    if base_dir is not None and (base_dir / p).exists():
        return base_dir / p
    return DATA_DIR / p


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every object of a JSONL file. Errors name the file and the 1-based line."""
    if not path.is_file():
        raise UsageError(f"suite data file {path} does not exist")
    return [obj for _, obj in iter_jsonl(path)]


def load_items(suite: str, source: Source, base_dir: Path | None) -> Sequence[dict[str, Any]]:
    """The source's items in source order (a list, or an HF Dataset indexed lazily)."""
    if source.file is not None:
        return read_jsonl(resolve_file(source.file, base_dir))
    return load_hf(suite, source)


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in _TRUE


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_reachable(timeout_s: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Whether the HF hub answers an HTTP request within timeout_s (any status counts as an answer).

    Runs in a daemon thread so that a hanging DNS lookup (not covered by `requests` timeouts)
    cannot block the caller for longer than ~timeout_s.
    """
    result: list[bool] = []

    def probe() -> None:
        import requests

        try:
            requests.head(hub_endpoint(), timeout=(timeout_s, timeout_s), allow_redirects=False)
            result.append(True)
        except Exception:
            result.append(False)

    t = threading.Thread(target=probe, daemon=True, name="hf-hub-probe")
    t.start()
    t.join(timeout_s + 1.0)
    return bool(result and result[0])


@contextlib.contextmanager
def _hf_offline() -> Iterator[None]:
    """Make `datasets` / `huggingface_hub` cache-only for the duration of the block.

    Both libraries read HF_HUB_OFFLINE when first imported; set the variables for an import that
    happens inside the block, and flip the already-imported modules' flags, restoring all after.
    """
    saved_env = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    saved_attrs: list[tuple[Any, str, Any]] = []
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    for mod_name, attrs in (("huggingface_hub.constants", ("HF_HUB_OFFLINE",)),
                            ("datasets.config", ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))):
        mod = sys.modules.get(mod_name)
        for a in attrs:
            if mod is not None and hasattr(mod, a):
                saved_attrs.append((mod, a, getattr(mod, a)))
                setattr(mod, a, True)
    try:
        yield
    finally:
        for mod, a, v in saved_attrs:
            setattr(mod, a, v)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def load_hf(suite: str, source: Source) -> Sequence[dict[str, Any]]:
    """Load an HF dataset split (or the dataset repo's `data_files` through the json builder, as
    z-lab loads LiveCodeBench). One clear UsageError when that is impossible."""
    import importlib.util

    what = source.hf + (f" ({source.config})" if source.config else "") + f" split {source.split}"
    if importlib.util.find_spec("datasets") is None:
        raise UsageError(f"suite {suite!r} loads the Hugging Face dataset {what}, which needs the `datasets` "
                         "package (not installed)",
                         hint="pip install 'ddtree-bench[datasets]'; or " + _OFFLINE_HINT)
    offline = _env_true("HF_HUB_OFFLINE") or _env_true("HF_DATASETS_OFFLINE")
    if not offline and not hub_reachable():
        offline = True
    ctx = _hf_offline() if offline else contextlib.nullcontext()
    try:
        with ctx:
            import datasets

            if source.data_files:
                base = f"{hub_endpoint()}/datasets/{source.hf}/resolve/main/"
                urls = [f if "://" in f else base + f for f in source.data_files]
                ds = datasets.load_dataset("json", data_files={source.split: urls}, split=source.split)
            else:
                ds = datasets.load_dataset(source.hf, source.config, split=source.split)
    except UsageError:
        raise
    except Exception as e:  # datasets raises many kinds (ConnectionError, FileNotFoundError, ValueError, ...)
        if offline:
            why = ("the Hugging Face hub is offline (HF_HUB_OFFLINE is set)"
                   if _env_true("HF_HUB_OFFLINE") or _env_true("HF_DATASETS_OFFLINE")
                   else f"the Hugging Face hub ({hub_endpoint()}) is unreachable")
            raise UsageError(f"suite {suite!r} needs the Hugging Face dataset {what}: {why} and it is not in the "
                             "local cache", hint=_OFFLINE_HINT) from None
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise UsageError(f"suite {suite!r}: could not load the Hugging Face dataset {what} "
                         f"({type(e).__name__}: {first})", hint=_OFFLINE_HINT) from None
    return ds
