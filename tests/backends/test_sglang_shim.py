"""The SGLang CPU shim's plain-torch ops (scripts/sglang_cpu_shim/sgl_kernel/torch_ops.py) do what SGLang's
Triton kernels of the same names do, on hand-worked examples; and its import hook runs a patch right after
its module, only when switched on. No SGLang needed: the shim is loaded from the repository by path.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from file_module_support import load_file

SHIM = Path(__file__).resolve().parents[2] / "scripts" / "sglang_cpu_shim"


def _ops():
    return load_file("shim_torch_ops", SHIM / "sgl_kernel" / "torch_ops.py")


def test_req_to_token_pool_and_extend_cache_locs_are_inverse_packings():
    ops = _ops()
    req_to_token = torch.zeros(3, 8, dtype=torch.int32)
    rows, start, end = torch.tensor([2, 0]), torch.tensor([1, 4]), torch.tensor([3, 7])
    locs = torch.tensor([10, 11, 20, 21, 22], dtype=torch.int64)     # request 0 gets 2 slots, request 1 gets 3
    ops.assign_req_to_token_pool_cpu(rows, req_to_token, start, end, locs, 8)
    assert req_to_token[2].tolist() == [0, 10, 11, 0, 0, 0, 0, 0]
    assert req_to_token[0].tolist() == [0, 0, 0, 0, 20, 21, 22, 0]
    assert not req_to_token[1].any()
    back = torch.full((5,), -1, dtype=torch.int64)
    ops.assign_extend_cache_locs_cpu(rows, req_to_token, start, end, back, 8)
    assert back.tolist() == locs.tolist()


def test_all_layer_kv_copy_moves_whole_rows_of_every_buffer_like_a_gather():
    ops = _ops()
    bufs = [torch.arange(24, dtype=torch.float32).view(6, 2, 2).clone(), torch.arange(12, dtype=torch.int64).view(6, 2).clone()]
    want = [b.clone() for b in bufs]
    for w in want:
        w[[1, 2]] = w[[2, 1]].clone()       # swap rows 1 and 2: overlapping source/target sets
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs], dtype=torch.int64)
    ops.copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([1, 2]), torch.tensor([2, 1]))
    for b, w in zip(bufs, want):
        assert torch.equal(b, w)


def test_patches_run_after_their_module_only_when_switched_on(tmp_path):
    pkg = tmp_path / "fake_sglang_mod.py"
    pkg.write_text("VALUE = 1\n")
    code = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(SHIM)!r}, {str(tmp_path)!r}]
        import ddtree_sglang_cpu_shim as shim, ddtree_sglang_cpu_shim.patches as P
        def p9_double(mod):
            mod.VALUE *= 2
        P.PATCHES[:] = [("fake_sglang_mod", p9_double)]
        shim.activate_from_env()
        import fake_sglang_mod
        print(fake_sglang_mod.VALUE)
    """)
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        env={"PATH": "/usr/bin:/bin", "DDTREE_BENCH_SGLANG_CPU_SHIM": "1"})
    assert off.stdout.strip() == "1" and "applied" not in off.stderr
    assert on.stdout.strip() == "2" and "ddtree-bench-shim: applied p9_double (fake_sglang_mod)" in on.stderr
