"""Real SGLang-CPU servers for the integration tests: where the interpreter is, and how to launch one.

The servers are launched exactly as a sweep launches them (the bundled `sglang` profile with its CPU
flags and env, `ServerProcess`, the profile's health path), so a profile that no longer matches the
installed SGLang fails here first. The interpreter is `DDTREE_BENCH_SGLANG_PYTHON`, else the venv
`scripts/install-sglang-cpu.sh` makes (SGLang 0.5.23 with ddtree-bench's CPU shim). Without it the tests
skip and say why, except under CI=true, where a missing SGLang is a failure (the real-server tests must run
in CI). A Python on PATH that imports sglang is not taken: on a CPU it would lack the shim.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SGLANG_PIN = "0.5.23"
DEFAULT_VENV = Path.home() / ".cache" / "ddtree-bench" / f"venv-sglang-cpu-{SGLANG_PIN}"
STARTUP_TIMEOUT_S = 900.0   # ~50-110 s quiet; several minutes when two start at once on 2 busy cores
DTYPE = "float32"           # parity with the fp32 reference; exercises the shim's fix of SGLang's bf16 cast (P6)


def sglang_python() -> str | None:
    from ddtree_bench.sweep import server_python

    for cand in (os.environ.get("DDTREE_BENCH_SGLANG_PYTHON"), str(DEFAULT_VENV / "bin" / "python")):
        if cand and os.access(cand, os.X_OK) and server_python.can_import(cand, "ddtree_sglang_cpu_shim"):
            return cand
    return None


def require_sglang() -> str:
    py = sglang_python()
    if py is None:
        why = (f"SGLang {SGLANG_PIN} with ddtree-bench's CPU shim is not installed (no DDTREE_BENCH_SGLANG_PYTHON, "
               f"no {DEFAULT_VENV}); install it with: bash scripts/install-sglang-cpu.sh")
        if os.environ.get("CI") == "true":
            pytest.fail("CI must drive a real SGLang: " + why)
        pytest.skip(why)
    return py


def sglang_command(method: str, port: int, py: str, model_dir: Path | None = None, draft_dir: Path | None = None):
    """The sweep's own command line for one SGLang-CPU server (profile `sglang`, device cpu, fp32); the
    bundled toy pair unless other directories are given."""
    from ddtree_bench.pair import TOY_DIR
    from ddtree_bench.sweep.profiles import build_command, load_profile, point_params

    model_dir = model_dir or TOY_DIR / "target"
    draft_dir = draft_dir or TOY_DIR / "draft"
    prof = load_profile("sglang")
    params = point_params(prof, model=str(model_dir), draft=str(draft_dir) if method != "ar" else None,
                          method=method, budget=None, spec_tokens=None, dtype=DTYPE, device="cpu",
                          host="127.0.0.1", port=port, server_python=py)
    return prof, build_command(prof, params)


def start_sglang(method: str, log_dir: Path, py: str, model_dir: Path | None = None, draft_dir: Path | None = None,
                 name: str | None = None):
    """Launch (not wait for) one SGLang-CPU server; returns the ServerProcess (wait_ready() to use it)."""
    from ddtree_bench.sweep.server import ServerProcess, free_port

    port = free_port()
    prof, cmd = sglang_command(method, port, py, model_dir, draft_dir)
    srv = ServerProcess(cmd.argv, port=port, log_path=log_dir / f"{name or 'sglang-' + method}.log",
                        health_path=prof.health_path, env=cmd.env, startup_timeout_s=STARTUP_TIMEOUT_S)
    return srv.start()
