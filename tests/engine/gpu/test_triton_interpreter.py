"""Every Triton kernel of the GPU path, run on this CPU through Triton's interpreter.

The kernel tests (tests/engine/gpu/test_tree_kernels_triton.py, test_fused_triton.py, test_attention_triton.py,
test_batch_attention_triton.py, test_gemm_triton.py, test_normalisers_triton.py: each kernel against its PyTorch
twin, bit for bit or within a few fp32 ulps; head dim 128 for the layer ops) are marked `gpu` and
need CUDA, or TRITON_INTERPRET=1 set before Triton defines the kernels - so they run here in a
child process with that variable set, at the smaller shapes they choose under the interpreter.
What still runs only on a GPU: bf16 kernels (the interpreter's fp32 -> bf16 cast does not round to
nearest even), the large shapes (15 depths, the 151,936-token vocabulary, B = 1024), CUDA graphs,
the builders' timing and choice, and the fused loop end to end (tests/engine/gpu/test_fastloop_cuda.py).
Skips when Triton is not installed (it is a dev dependency) or when CUDA is present (then the
kernel tests run directly).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from triton_support import HAVE_TRITON

ROOT = Path(__file__).resolve().parents[3]
FILES = ["tests/engine/gpu/test_tree_kernels_triton.py", "tests/engine/gpu/test_fused_triton.py",
         "tests/engine/gpu/test_attention_triton.py", "tests/engine/gpu/test_batch_attention_triton.py",
         "tests/engine/gpu/test_gemm_triton.py", "tests/engine/gpu/test_normalisers_triton.py"]


@pytest.mark.skipif(not HAVE_TRITON, reason="triton is not installed (pip install -e '.[dev]')")
@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the kernel tests run directly")
def test_every_triton_kernel_matches_its_twin_under_the_interpreter():
    """The kernel files in two child processes at once (attention, the longest, beside the other three), since the
    suite around this test runs on one core of CI's two; each must pass with nothing skipped."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    groups = [[f for f in FILES if "attention" in f], [f for f in FILES if "attention" not in f]]
    procs = [subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", *files],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for files in groups]
    passed = 0
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=1500)
            assert proc.returncode == 0, out[-6000:]
            passed += int(re.search(r"(\d+) passed", out).group(1))
            assert "skipped" not in out.splitlines()[-1], out[-2000:]
    finally:   # a failure or a timeout in one leaves no child running
        for proc in procs:
            proc.kill()
            proc.wait()
    assert passed >= 85
