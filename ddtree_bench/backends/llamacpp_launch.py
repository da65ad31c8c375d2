"""`ddtree-bench run --backend llamacpp` without `--url`: convert the model pair to GGUF, start llama-server
for the run from the bundled `llamacpp` profile (the command line a sweep would use), stop it afterwards.

`launched_server(...)` is a context manager yielding a `LaunchedServer` (its URL, the command, the log);
bad input is a UsageError (exit 2): DDTree (llama-server verifies chains only), a model llama.cpp's
converter refuses (its reason), no llama-server (the install hint), a server that does not start (the
tail of its log). Knows the profile, the GGUF conversion and ServerProcess; nothing of runs or records.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ddtree_bench import defaults as D
from ddtree_bench.errors import UsageError


@dataclass
class LaunchedServer:
    url: str
    command: str          # as a sweep's server.json records it
    log: Path


@contextlib.contextmanager
def launched_server(model: str, draft: str | None, method: str, dtype: str = D.DTYPE, device: str = D.DEVICE,
                    llama_server: str | None = None, max_batch: int = 1, log_dir: Path | None = None) -> Iterator[LaunchedServer]:
    from ddtree_bench.backends.llamacpp_gguf import ConversionRefused, find_server, gguf_pair
    from ddtree_bench.pair import model_dirs
    from ddtree_bench.sweep.profiles import build_command, load_profile, point_params
    from ddtree_bench.sweep.server import ServerError, ServerProcess, free_port, start_ready

    if method == "ddtree":
        raise UsageError("llama-server cannot serve DDTree (it verifies chains only)", hint="use --method ar or dflash")
    if model == "random":
        raise UsageError("--model random exists only inside ddtree-bench; llama-server needs a model directory")
    target_dir, draft_dir = model_dirs(model, draft)
    if method != "ar" and draft_dir is None:
        raise UsageError(f"--method {method} on llama-server needs a drafter", hint="pass --draft DIR")
    binary = find_server(llama_server)
    try:
        pair = gguf_pair(target_dir, draft_dir if method != "ar" else None, dtype)
    except ConversionRefused as e:
        raise UsageError(f"llama.cpp cannot serve {model}: {e}") from None
    prof = load_profile("llamacpp")
    logs = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="ddtree-bench-llamacpp-"))
    cmds = []

    def make() -> ServerProcess:
        port = free_port(D.HOST)
        params = point_params(prof, model=str(pair.target), draft=str(pair.draft) if pair.draft else None,
                              method=method, budget=None, spec_tokens=None, dtype=dtype, device=device, host=D.HOST,
                              port=port, server_bin=binary, max_batch=max_batch)
        cmds.append(build_command(prof, params))
        return ServerProcess(cmds[-1].argv, port=port, log_path=logs / "llama-server.log", health_path=prof.health_path,
                             env=cmds[-1].env, startup_timeout_s=prof.startup_timeout_s or D.SERVER_STARTUP_TIMEOUT_S)

    try:
        srv = start_ready(make)   # again on fresh ports if its port was taken while it started
    except ServerError as e:
        raise UsageError(f"llama-server did not start: {e}", hint=f"its log: {logs / 'llama-server.log'}") from None
    cmd = cmds[-1]
    try:
        yield LaunchedServer(srv.url, cmd.display(), srv.log_path)
    finally:
        srv.stop()
