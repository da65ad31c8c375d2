"""llama.cpp's side of a sweep: where `llama-server` and the GGUF converter are, and Hugging Face model
directories converted to GGUF files (cached by content hash).

* `find_server(explicit)`: `--llama-server BIN` (grid `llama_server:`) when given, else the first
  `llama-server` on PATH, else the one `scripts/install-llama-cpp.sh` built
  (`install_dir()/build/bin/llama-server`). UsageError (exit 2) naming what was tried otherwise.
* `find_converter()`: the install script's converter, `convert_hf_to_gguf.py` of the same pinned
  llama.cpp source and the venv that runs it (`install_dir()/venv-convert`).
* `to_gguf(hf_dir, outtype, target_dir=None)`: one GGUF file per (model content, drafter's target
  content, outtype, converter, this module's conversion rules), under `gguf_cache_dir()`; a second
  call with the same content returns the cached file without running the converter. A drafter
  (z-lab DFlash layout) converts with `--target-model-dir` (llama.cpp's `dflash` architecture takes
  the target's tokenizer and layer count from there). Conversion runs `llamacpp_convert_main.py`,
  which adapts merge-less byte-level BPE tokenizers (the toy's): see its docstring for why the two
  adjustments are exact. A refusal raises `ConversionRefused` with the converter's own last lines.

The content hash covers every regular file of the directory (names and bytes), so an edited config or
retrained weights convert again; file digests are memoised per (path, size, mtime) in the cache.
Install location: $DDTREE_BENCH_LLAMA_CPP_DIR, else ~/.cache/ddtree-bench/llama.cpp-<PIN> (the install
script's rule); GGUF cache: $DDTREE_BENCH_GGUF_CACHE, else <project cache>/gguf.
Knows files and the converter's command line; nothing of HTTP, sweeps or records.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ddtree_bench.errors import UsageError

PIN = "0.3.36"                      # llama-cpp-python sdist whose vendor/llama.cpp is built and converts
SERVER_NAME = "llama-server"
ENV_INSTALL = "DDTREE_BENCH_LLAMA_CPP_DIR"
ENV_GGUF_CACHE = "DDTREE_BENCH_GGUF_CACHE"
CONVERT_TIMEOUT_S = 1800.0
RULES_VERSION = 3                   # bump when llamacpp_convert_main.py changes what a conversion writes
OUTTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
INSTALL_HINT = "bash scripts/install-llama-cpp.sh (builds llama-server and the converter venv; docs/llama-cpp.md)"


class ConversionRefused(Exception):
    """The converter (or our adaptation of it) refused a model directory; the message says why."""


@dataclass(frozen=True)
class Converter:
    python: Path          # the converter venv's interpreter
    llama_dir: Path       # vendor/llama.cpp of the pinned sdist (convert_hf_to_gguf.py, conversion/, gguf-py/)


def install_dir() -> Path:
    env = os.environ.get(ENV_INSTALL)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ddtree-bench" / f"llama.cpp-{PIN}"


def gguf_cache_dir() -> Path:
    env = os.environ.get(ENV_GGUF_CACHE)
    if env:
        return Path(env).expanduser()
    from ddtree_bench.engine.gpu.kernels.cache_dir import project_cache_dir

    return project_cache_dir() / "gguf"


def _executable(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def find_server(explicit: str | None = None) -> str:
    """The llama-server binary by the module docstring's rule; UsageError naming what was tried."""
    if explicit:
        p = Path(explicit).expanduser()
        if _executable(p):
            return str(p)
        found = shutil.which(explicit)
        if found is None:
            raise UsageError(f"--llama-server {explicit}: no such executable", hint=INSTALL_HINT)
        return found
    on_path = shutil.which(SERVER_NAME)
    if on_path:
        return on_path
    built = install_dir() / "build" / "bin" / SERVER_NAME
    if _executable(built):
        return str(built)
    raise UsageError(f"no {SERVER_NAME} found (not on PATH, not at {built})", hint=INSTALL_HINT)


def find_converter() -> Converter:
    root = install_dir()
    py = root / "venv-convert" / "bin" / "python"
    llama = root / "src" / f"llama_cpp_python-{PIN}" / "vendor" / "llama.cpp"
    if not _executable(py) or not (llama / "convert_hf_to_gguf.py").is_file():
        raise UsageError(f"the GGUF converter is not installed (looked for {py} and {llama / 'convert_hf_to_gguf.py'})",
                         hint=INSTALL_HINT)
    return Converter(py, llama)


# ---------------------------------------------------------------------------- content hashing


def _file_digest(path: Path, memo: dict[str, list]) -> str:
    st = path.stat()
    key = str(path.resolve())
    hit = memo.get(key)
    if hit and hit[0] == st.st_size and hit[1] == st.st_mtime_ns:
        return hit[2]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    memo[key] = [st.st_size, st.st_mtime_ns, h.hexdigest()]
    return memo[key][2]


def content_hash(model_dir: Path, memo: dict[str, list] | None = None) -> str:
    """sha256 over (relative name, sha256 of bytes) of every regular file under `model_dir`, sorted."""
    memo = {} if memo is None else memo
    h = hashlib.sha256()
    files = sorted(p for p in Path(model_dir).rglob("*") if p.is_file() and not p.name.startswith("."))
    for p in files:
        h.update(str(p.relative_to(model_dir)).encode() + b"\0" + _file_digest(p, memo).encode() + b"\n")
    return h.hexdigest()


def _load_memo(cache: Path) -> dict[str, list]:
    try:
        data = json.loads((cache / "digests.json").read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _save_memo(cache: Path, memo: dict[str, list]) -> None:
    tmp = cache / f"digests.json.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(memo), encoding="utf-8")
        os.replace(tmp, cache / "digests.json")
    except OSError:
        tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------------------- tokenizer check


def merge_less_byte_bpe(tokenizer_dir: Path) -> bool:
    """Is tokenizer.json a byte-level BPE with an empty merge list (the case llamacpp_convert_main adapts)?"""
    try:
        tok = json.loads((Path(tokenizer_dir) / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    model = tok.get("model") or {}
    pre = tok.get("pre_tokenizer") or {}
    kinds = [pre.get("type")] + [p.get("type") for p in pre.get("pretokenizers") or [] if isinstance(p, dict)]
    return model.get("type") == "BPE" and not model.get("merges") and "ByteLevel" in kinds


def has_mtp_layers(model_dir: Path) -> bool:
    """Does the checkpoint carry multi-token-prediction layers (config `mtp_num_hidden_layers` > 0, or
    tensors named `mtp.*`, read from the safetensors headers)?"""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cfg = {}
    if any((c or {}).get("mtp_num_hidden_layers") for c in (cfg, cfg.get("text_config"))):
        return True
    for f in Path(model_dir).glob("*.safetensors"):
        try:
            with open(f, "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                names = json.loads(fh.read(n)) if 0 < n < (1 << 28) else {}
        except (OSError, ValueError):
            continue
        if any(k.startswith("mtp.") or ".mtp." in k for k in names):
            return True
    return False


# ---------------------------------------------------------------------------- conversion


def to_gguf(hf_dir: str | Path, dtype: str = "float32", target_dir: str | Path | None = None,
            converter: Converter | None = None) -> Path:
    """The GGUF file of `hf_dir` (converted once per content; see the module docstring)."""
    hf_dir = Path(hf_dir).expanduser().resolve()
    if not (hf_dir / "config.json").is_file():
        raise UsageError(f"{hf_dir} is not a Hugging Face model directory (no config.json)")
    if dtype not in OUTTYPES:
        raise UsageError(f"llama.cpp conversion: unknown dtype {dtype!r}; expected one of {', '.join(OUTTYPES)}")
    conv = converter or find_converter()
    cache = gguf_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    memo = _load_memo(cache)
    tdir = Path(target_dir).expanduser().resolve() if target_dir is not None else None
    parts = {"pin": PIN, "rules": RULES_VERSION, "outtype": OUTTYPES[dtype], "model": content_hash(hf_dir, memo),
             "target": content_hash(tdir, memo) if tdir is not None else None}
    _save_memo(cache, memo)
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]
    out_dir = cache / key
    out = out_dir / "model.gguf"
    if out.is_file():
        return out
    tok_dir = tdir if tdir is not None else hf_dir
    mode = "merge-less-byte-bpe" if merge_less_byte_bpe(tok_dir) else "plain"
    mtp = "keep" if has_mtp_layers(hf_dir) else "absent"
    script = Path(__file__).with_name("llamacpp_convert_main.py")
    work = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=cache))
    argv = [str(conv.python), str(script), str(conv.llama_dir), mode, mtp, "--", str(hf_dir),
            "--outfile", str(work / "model.gguf"), "--outtype", OUTTYPES[dtype]]
    if tdir is not None:
        argv += ["--target-model-dir", str(tdir)]
    try:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=CONVERT_TIMEOUT_S,
                           env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    except subprocess.TimeoutExpired:
        shutil.rmtree(work, ignore_errors=True)
        raise ConversionRefused(f"convert_hf_to_gguf.py ran past {CONVERT_TIMEOUT_S:g} s on {hf_dir}") from None
    log = r.stdout + r.stderr
    if r.returncode != 0 or not (work / "model.gguf").is_file():
        shutil.rmtree(work, ignore_errors=True)
        raise ConversionRefused(f"convert_hf_to_gguf.py refused {hf_dir}: {_reason(log)}")
    (work / "conversion.json").write_text(json.dumps({**parts, "source": str(hf_dir), "target_dir": str(tdir) if tdir else None,
                                                      "mode": mode, "argv": argv[1:]}, indent=1) + "\n", encoding="utf-8")
    (work / "convert.log").write_text(log, encoding="utf-8")
    try:
        os.replace(work, out_dir)
    except OSError:  # another process converted the same content first
        shutil.rmtree(work, ignore_errors=True)
    return out


def _reason(log: str) -> str:
    """The converter's own explanation: the last exception line, else the last non-progress lines."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip() and "Writing:" not in ln and set(ln.strip()) != {"^"}]
    for i in range(len(lines) - 1, -1, -1):
        ln = lines[i]
        if ln.startswith(("NotImplementedError", "ValueError", "KeyError", "AssertionError", "TypeError",
                          "RuntimeError", "SystemExit", "FileNotFoundError", "Exception", "ddtree-bench:")) or "Error:" in ln:
            if ":" not in ln and i >= 2:  # a bare exception name: say where (the failing line and its file)
                ln = f"{ln} at {lines[i - 1]} ({lines[i - 2]})"
            return ln[:400]
    return " | ".join(lines[-3:])[:400] or "no output"


@dataclass(frozen=True)
class GGUFPair:
    target: Path
    draft: Path | None


_PAIRS: dict[tuple[str, str | None, str], GGUFPair] = {}


def gguf_pair(model_dir: str | Path, draft_dir: str | Path | None, dtype: str) -> GGUFPair:
    """The target's GGUF and the drafter's (converted against that target); memoised per process, so a
    sweep that renders one server command per point hashes each directory once."""
    key = (str(model_dir), str(draft_dir) if draft_dir is not None else None, dtype)
    if key not in _PAIRS:
        target = to_gguf(model_dir, dtype)
        draft = to_gguf(draft_dir, dtype, target_dir=model_dir) if draft_dir is not None else None
        _PAIRS[key] = GGUFPair(target, draft)
    return _PAIRS[key]
