"""Where compiled Triton kernels persist: one directory under the project's cache dir, so a second
process (the next run, the next sweep point, a restarted server) compiles nothing.

The rule (`triton_cache_dir`), first that applies:
1. TRITON_CACHE_DIR, when the user set it (Triton's own variable);
2. $DDTREE_BENCH_CACHE_DIR/triton;
3. $XDG_CACHE_HOME/ddtree-bench/triton;
4. defaults.CACHE_DIR/triton (~/.cache/ddtree-bench/triton).
`use_project_cache()` puts the rule's answer in TRITON_CACHE_DIR before Triton compiles anything
(kernels/common.py calls it before importing Triton, and Triton reads the variable when it compiles)
and returns it; env.environment() records it, so every run.json and bench-engine result says which
cache a run used. Knows nothing of kernels.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ddtree_bench import defaults as D

ENV_PROJECT = "DDTREE_BENCH_CACHE_DIR"
ENV_TRITON = "TRITON_CACHE_DIR"


def project_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """The project's cache directory: $DDTREE_BENCH_CACHE_DIR, else $XDG_CACHE_HOME/ddtree-bench, else defaults.CACHE_DIR."""
    env = os.environ if env is None else env
    if env.get(ENV_PROJECT):
        return Path(env[ENV_PROJECT]).expanduser()
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "ddtree-bench"
    return Path(D.CACHE_DIR).expanduser()


def triton_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """The Triton cache directory by the module docstring's rule (TRITON_CACHE_DIR wins when set)."""
    env = os.environ if env is None else env
    if env.get(ENV_TRITON):
        return Path(env[ENV_TRITON]).expanduser()
    return project_cache_dir(env) / "triton"


def use_project_cache() -> str:
    """Set TRITON_CACHE_DIR to triton_cache_dir() unless the user set it; return it."""
    path = str(triton_cache_dir())
    os.environ.setdefault(ENV_TRITON, path)
    return os.environ[ENV_TRITON]
