"""Load a Python file that is not part of an importable package (a benchmark script, a file of the SGLang shim) as
a module, so a test can call its functions. Knows importlib; nothing of what the files hold."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load_file(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
