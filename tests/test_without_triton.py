"""The product on an install without Triton (the CPU torch wheel has none; only the dev extra brings it).

The test install always has Triton, so these tests hide it: a subprocess whose import system refuses `triton`
(a meta-path finder that raises ImportError, as a missing package would). Checked there: every module of the
package imports; the main job's CPU path (`run`, `sweep`, `baseline record`) runs and never imports a Triton
kernel module (only the Triton-free names in kernels/experimental.py and kernels/cache_dir.py). The README's
fresh-machine command itself runs in CI from a venv without extras (scripts/fresh-machine-check.sh).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

HIDE_TRITON = textwrap.dedent("""
    import sys
    class _NoTriton:
        def find_spec(self, name, path=None, target=None):
            if name == "triton" or name.startswith("triton."):
                raise ImportError("No module named 'triton' (hidden by the test)")
            return None
    sys.meta_path.insert(0, _NoTriton())
""")

# what the CPU path may import from the GPU package: names only, no kernels
ALLOWED_GPU_MODULES = {"ddtree_bench.engine.gpu", "ddtree_bench.engine.gpu.kernels",
                       "ddtree_bench.engine.gpu.kernels.experimental", "ddtree_bench.engine.gpu.kernels.cache_dir"}


def _python(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HIDE_TRITON + textwrap.dedent(code)], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def test_the_hiding_works(tmp_path):
    done = _python("""
        try:
            import triton
        except ImportError:
            print("hidden")
    """, tmp_path)
    assert done.stdout.strip() == "hidden", done.stderr


def test_every_module_imports_without_triton(tmp_path):
    done = _python("""
        import importlib, pkgutil, ddtree_bench
        bad = []
        for m in pkgutil.walk_packages(ddtree_bench.__path__, "ddtree_bench."):
            if m.name.endswith("__main__"):
                continue
            try:
                importlib.import_module(m.name)
            except Exception as err:
                bad.append(f"{m.name}: {type(err).__name__}: {err}")
        print("\\n".join(bad) or "ok")
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok", done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("argv", [
    ["run", "--method", "ddtree", "--budget", "16", "--limit", "1", "--max-new-tokens", "8", "--out", "r"],
    ["sweep", "--budgets", "16", "--limit", "1", "--max-new-tokens", "8", "--out", "s"],
    ["baseline", "record", "--limit", "1", "--max-new-tokens", "8", "--out", "b.jsonl"],
], ids=["run", "sweep", "baseline-record"])
def test_the_cpu_commands_run_without_triton_and_import_no_kernel(tmp_path, argv):
    done = _python(f"""
        import json, sys
        from ddtree_bench.cli import main
        sys.argv = ["ddtree-bench"] + {argv!r}
        try:
            main()
        except SystemExit as stop:
            code = stop.code or 0
        else:
            code = 0
        gpu = sorted(m for m in sys.modules if m.startswith("ddtree_bench.engine.gpu"))
        print("RESULT " + json.dumps({{"code": code, "gpu_modules": gpu}}))
    """, tmp_path)
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(line[-1][len("RESULT "):])
    assert result["code"] == 0, done.stderr[-2000:]
    assert set(result["gpu_modules"]) <= ALLOWED_GPU_MODULES, result["gpu_modules"]
    assert "internal error" not in done.stderr
