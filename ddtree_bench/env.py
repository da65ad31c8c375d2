"""What a results file records about where it was made: versions, git sha, device, command line.

Knows nothing of models or runs; every writer of run.json / baselines calls `environment()`.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ddtree_bench import __version__


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def git_sha() -> str | None:
    """The ddtree-bench checkout's commit (with '-dirty' when it has local changes), if any."""
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def device_info(device: str | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {"platform": platform.platform(), "processor": platform.processor() or platform.machine()}
    try:
        import os

        info["cpu_count"] = os.cpu_count()
    except Exception:
        pass
    if device and device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            idx = torch.device(device).index or 0
            info["gpu"] = torch.cuda.get_device_name(idx)
            info["cuda"] = torch.version.cuda
    return info


def environment(device: str | None = None) -> dict[str, Any]:
    versions: dict[str, Any] = {"python": platform.python_version(), "ddtree_bench": __version__}
    for mod in ("torch", "triton", "transformers", "tokenizers", "aiohttp"):
        m = sys.modules.get(mod)
        if m is None and mod != "transformers":  # transformers is only recorded when something loaded it
            try:
                m = __import__(mod)
            except Exception:
                continue
        if m is None:
            continue
        versions[mod] = getattr(m, "__version__", None)
    from ddtree_bench.engine.gpu.kernels.cache_dir import triton_cache_dir

    return {"versions": versions, "git_sha": git_sha(), "device": device_info(device), "command": sys.argv,
            "triton_cache_dir": str(triton_cache_dir()),   # compiled kernels persist there (kernels/cache_dir.py)
            "engine_knobs": engine_knobs()}


def engine_knobs() -> dict[str, str]:
    """The environment variables that change which GPU kernels the engine runs, as set (unset ones left out):
    DDTREE_GPU_EXPERIMENTAL and every A/B knob DDTREE_<KNOB> (kernels/experimental.py), and DDTREE_GEMM_TABLE
    (kernels/gemm.py), so that two results files made with different kernels say so."""
    import os

    from ddtree_bench.engine.gpu.kernels import experimental   # Triton-free: names only, no kernel module

    names = (experimental.ENV, *(f"DDTREE_{k}" for k in experimental.KNOBS), experimental.GEMM_TABLE_ENV)
    return {name: os.environ[name] for name in names if os.environ.get(name)}
