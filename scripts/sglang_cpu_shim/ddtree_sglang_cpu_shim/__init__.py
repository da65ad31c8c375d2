"""ddtree-bench's CPU shim for SGLang 0.5.23: import-time patches that let `sglang.launch_server --device cpu`
serve DFlash (and AR) on a CPU without the compiled CPU sgl-kernel.

Installed by scripts/install-sglang-cpu.sh into the SGLang venv only (never into ddtree-bench's own
environment), with a `.pth` line that calls `activate_from_env()` when any interpreter of that venv starts.
It does nothing unless DDTREE_BENCH_SGLANG_CPU_SHIM=1 (the bundled sglang profile sets it on CPU), so the
same venv is plain SGLang otherwise. Once active it watches the imports of the SGLang modules named in
`patches.PATCHES` and runs each patch right after its module has executed; SGLang's files are untouched.
Every applied patch prints one line `ddtree-bench-shim: applied <name> (<module>)` on stderr, so a server
log (and the sweep's server.json) shows which ones ran. The stand-in `sgl_kernel` package beside this one
is the other half of the shim.

Knows SGLang 0.5.23's module layout; nothing of ddtree-bench.
"""

from __future__ import annotations

import importlib.abc
import os
import sys

ENV = "DDTREE_BENCH_SGLANG_CPU_SHIM"
SKIP_ENV = "DDTREE_BENCH_SGLANG_CPU_SHIM_SKIP"   # e.g. "p2,p3": leave those patches out (to show each is needed)
SGLANG_PIN = "0.5.23"
LOG_PREFIX = "ddtree-bench-shim:"
_active = False


def log(msg: str) -> None:
    print(f"{LOG_PREFIX} {msg}", file=sys.stderr, flush=True)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds a watched module through the other finders, then runs its patches after the module executed."""

    def __init__(self, watch):
        self.watch = watch

    def find_spec(self, name, path, target=None):
        if name not in self.watch:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader, patches = spec.loader, self.watch[name]
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run_module = loader.exec_module

        def exec_module(module):
            run_module(module)
            for patch in patches:
                patch(module)
                log(f"applied {patch.__name__} ({name})")

        loader.exec_module = exec_module
        return spec


def activate_from_env() -> None:
    if os.environ.get(ENV) == "1":
        activate()


def activate() -> None:
    """Install the import hook (once). Called at interpreter start by the .pth line when the env var is 1."""
    global _active
    if _active:
        return
    from ddtree_sglang_cpu_shim.patches import PATCHES

    skip = set(filter(None, os.environ.get(SKIP_ENV, "").split(",")))
    watch: dict = {}
    for module, fn in PATCHES:
        if fn.__name__.split("_", 1)[0] in skip:
            log(f"skipped {fn.__name__} ({SKIP_ENV})")
            continue
        watch.setdefault(module, []).append(fn)
    sys.meta_path.insert(0, _AfterImport(watch))
    _active = True


def check_installed() -> None:
    """For the install script: the shim is active, the venv's SGLang is the one the patches were written for,
    and the stand-in sgl_kernel is the one imported. Raises SystemExit with a reason otherwise."""
    import importlib.metadata as md

    import sgl_kernel

    if not _active:
        raise SystemExit(f"the shim is not active ({ENV}=1 not seen at start-up: is the .pth installed?)")
    if md.version("sglang") != SGLANG_PIN:
        raise SystemExit(f"the shim is written for sglang {SGLANG_PIN}, found {md.version('sglang')}")
    if not getattr(sgl_kernel, "DDTREE_BENCH_STAND_IN", False):
        raise SystemExit(f"sgl_kernel is not the shim's stand-in: {sgl_kernel.__file__}")
