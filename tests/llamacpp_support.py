"""Real llama.cpp servers for the integration tests: where llama-server is, and how to launch one.

The servers are launched exactly as a sweep launches them: the bundled `llamacpp` profile, the GGUF files
`backends/llamacpp_gguf.py` converts (and caches), `ServerProcess`. So a profile or a conversion that no
longer matches the built llama.cpp fails here first. The binary is `DDTREE_BENCH_LLAMA_SERVER`, else
the first llama-server on PATH, else the one `scripts/install-llama-cpp.sh` built; the converter is the
install script's. Without them the tests skip and say why, except under CI=true, where a missing
llama.cpp is a failure (the real-server tests must run in CI).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

STARTUP_TIMEOUT_S = 300.0   # a few seconds for the toy; longer when several start at once on 2 busy cores


def llama_server() -> str | None:
    from ddtree_bench.backends.llamacpp_gguf import find_converter, find_server
    from ddtree_bench.errors import UsageError

    try:
        find_converter()
        return find_server(os.environ.get("DDTREE_BENCH_LLAMA_SERVER"))
    except UsageError:
        return None


def require_llama_server() -> str:
    binary = llama_server()
    if binary is None:
        why = ("llama.cpp is not installed (no DDTREE_BENCH_LLAMA_SERVER, no llama-server on PATH or in the install "
               "script's cache, or no converter venv); install it with: bash scripts/install-llama-cpp.sh")
        if os.environ.get("CI") == "true":
            pytest.fail("CI must drive a real llama.cpp: " + why)
        pytest.skip(why)
    return binary


def llamacpp_command(method: str, port: int, binary: str, target: Path, draft: Path | None, max_batch: int = 1):
    """The sweep's own command line for a target (+ drafter) directory on this CPU (profile `llamacpp`, f32)."""
    from ddtree_bench.backends.llamacpp_gguf import gguf_pair
    from ddtree_bench.sweep.profiles import build_command, load_profile, point_params

    prof = load_profile("llamacpp")
    pair = gguf_pair(target, draft if method != "ar" else None, "float32")
    params = point_params(prof, model=str(pair.target), draft=str(pair.draft) if pair.draft else None, method=method,
                          budget=None, spec_tokens=None, dtype="float32", device="cpu", host="127.0.0.1", port=port,
                          server_bin=binary, max_batch=max_batch)
    return build_command(prof, params)


def start_llamacpp(name: str, method: str, log_dir: Path, binary: str, target: Path, draft: Path | None,
                   max_batch: int = 1):
    """Launch (not wait for) one llama-server; returns the ServerProcess."""
    from ddtree_bench.sweep.server import ServerProcess, free_port

    port = free_port()
    cmd = llamacpp_command(method, port, binary, target, draft, max_batch)
    srv = ServerProcess(cmd.argv, port=port, log_path=log_dir / f"llamacpp-{name}.log", env=cmd.env,
                        startup_timeout_s=STARTUP_TIMEOUT_S)
    return srv.start()
