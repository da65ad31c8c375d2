"""benchmarks/gpu_gluon_prefix_probe.py on a CPU: its Gluon kernel compiles for sm_90 with this Triton, and the
overlap arm really is FlashAttention-3's order (its loop leaves one wgmma group in flight while the softmax runs;
the sync arm never does), both loading K / V by TMA; its Triton arm, the engine's prefix step, equals the fp32
reference under the interpreter. The probe's GPU figures (docs/measurements/2026-12-07/h100-f-gluon) compare those
arms, so each must be the kernel its name says."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_gluon_prefix_probe.py"
pytest.importorskip("triton", reason="the probe's kernels are Triton / Gluon kernels")
pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper", reason="this Triton has no Gluon Hopper module")


def _probe():
    spec = importlib.util.spec_from_file_location("gluon_prefix_probe", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _interpreted(body: str) -> None:
    """Run `body` with the probe imported as `p` under Triton's interpreter (a fresh process: the flag is read at
    import); it prints "ok" when its asserts hold."""
    code = ("import torch, importlib.util\n"
            f"spec = importlib.util.spec_from_file_location('p', {str(SCRIPT)!r})\n"
            "p = importlib.util.module_from_spec(spec); spec.loader.exec_module(p)\n" + body)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(SCRIPT.parents[1])}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_the_overlap_arm_keeps_one_wgmma_in_flight_and_the_sync_arm_none():
    probe = _probe()
    overlap = probe.compile_sm90(64, 64, 3, overlap=True)
    sync = probe.compile_sm90(64, 128, 2, overlap=False)
    tree = probe.compile_sm90(64, 64, 3, overlap=True, tree=True)
    for ptx in (overlap, sync, tree):
        assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    assert "wgmma.wait_group.sync.aligned 1;" in overlap and "wgmma.wait_group.sync.aligned 1;" in tree
    assert "wgmma.wait_group.sync.aligned 1;" not in sync


def test_the_tree_arms_reference_is_the_engines_tree_attention_under_the_interpreter():
    """The tree mode checks every arm against reference_tree over random_tree's rows: both must be what the engine's
    tree_attend computes (the engine arm is checked against them on the GPU too)."""
    code = (
        "from ddtree_bench.engine.gpu.kernels.tree_attention import tree_attend, vis_words\n"
        "torch.manual_seed(0)\n"
        "n, prefix = 70, 64\n"
        "q = torch.randn(8, n, 32); k = torch.randn(2, prefix + n, 32); v = torch.randn(2, prefix + n, 32)\n"
        "path, depth = p.random_tree(n)\n"
        "assert int(depth.max()) == 15 and (path[torch.arange(n), depth] == torch.arange(n)).all()\n"
        "pre = torch.tensor(prefix)\n"
        "got = tree_attend(q, k, v, path, pre + depth, pre, words=vis_words(path, pre + depth, pre))\n"
        "err = (got - p.reference_tree(q, k, v, path, depth, prefix)).abs().max().item()\n"
        "assert err < 1e-4, err\n"
        "print('ok')\n")
    _interpreted(code)


def test_the_triton_arm_equals_the_reference_under_the_interpreter():
    code = (
        "torch.manual_seed(0)\n"
        "q = torch.randn(8, 5, 32); k = torch.randn(2, 90, 32); v = torch.randn(2, 90, 32)\n"
        "for prefix in (64, 77):\n"
        "    got = p.triton_prefix(q, k, v, torch.tensor(prefix), block_m=16, block_n=16, stages=1)\n"
        "    err = (got - p.reference(q, k, v, prefix)).abs().max().item()\n"
        "    assert err < 1e-4, (prefix, err)\n"
        "print('ok')\n")
    _interpreted(code)
