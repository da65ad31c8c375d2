"""The few-row weight GEMM (engine/gpu/kernels/gemm.py) against its twins - F.linear, and the SiLU-mul of
F.linear for the merged gate/up - split and not, K not a multiple of the K step, ragged rows and columns,
and a whole fused target forward whose every GEMM goes through it. They run on CUDA, and in CI on a CPU
under Triton's interpreter (engine/gpu/test_triton_interpreter.py):
    TRITON_INTERPRET=1 python -m pytest -m gpu tests/engine/gpu/test_gemm_triton.py
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ddtree_bench.engine.gpu import fused
from ddtree_bench.engine.gpu.forward import StaticKV, group_size, target_forward, visible_bias
from ddtree_bench.engine.gpu.fused import TORCH_OPS
from ddtree_bench.engine.gpu.kernels import gemm
from ddtree_bench.engine.gpu.kernels.gemm import GemmConfig
from ddtree_bench.engine.gpu.tree_ops import verify_visible
from ddtree_bench.engine.loading import random_pair

from triton_support import DEV, triton_only

DTYPES = ["float32"] + (["bfloat16"] if DEV == "cuda" else [])   # the interpreter's bf16 cast does not round to nearest
SMALL = GemmConfig(block_m=16, block_n=16, block_k=32, split_k=1, warps=4, stages=2)


def kernel_check(test):
    return pytest.mark.gpu(triton_only(pytest.mark.parametrize("dtype", DTYPES)(test)))


def _close(got, want, dtype):
    if dtype == torch.float32:   # only the summation order differs (split ranges, K steps)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    else:
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


CASES = [  # M, N, K, split_k: one row, ragged rows/columns, K off the step, more splits than steps
    (1, 48, 64, 1), (5, 100, 96, 3), (16, 64, 128, 2), (33, 40, 80, 4), (7, 32, 32, 8)]


@kernel_check
@pytest.mark.parametrize("M,N,K,split", CASES)
def test_linear_matches_f_linear(dtype, M, N, K, split):
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(M * 1000 + N)
    x, w = torch.randn(M, K, generator=g).to(DEV, dt), torch.randn(N, K, generator=g).to(DEV, dt)
    launch = GemmConfig(16, 16, 32, split, 4, 2)
    y = gemm.linear(x, w, launch)
    assert y.shape == (M, N) and y.dtype == dt
    _close(y, F.linear(x, w), dt)


@kernel_check
@pytest.mark.parametrize("M,N,K,split", CASES)
def test_swiglu_matches_silu_mul_of_the_merged_gemm(dtype, M, N, K, split):
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(M * 7 + K)
    x, gu = torch.randn(M, K, generator=g).to(DEV, dt), torch.randn(2 * N, K, generator=g).to(DEV, dt)
    y = gemm.swiglu(x, gu, GemmConfig(16, 16, 32, split, 4, 2))
    assert y.shape == (M, N)
    _close(y, TORCH_OPS.silu_mul(F.linear(x, gu)), dt)


@kernel_check
def test_a_strided_row_view_is_read_through_its_stride(dtype):
    """x may be rows of a wider tensor (the forward's slices): the kernel reads row r at r * stride."""
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(1)
    wide, w = torch.randn(9, 160, generator=g).to(DEV, dt), torch.randn(24, 64, generator=g).to(DEV, dt)
    x = wide[:, 32:96]
    _close(gemm.linear(x, w, SMALL), F.linear(x, w), dt)


@kernel_check
@pytest.mark.parametrize("fused_reduce", [False, True])
def test_fused_target_forward_with_the_triton_gemm_matches_the_twin(dtype, fused_reduce):
    """Every weight GEMM of a verify forward (merged q/k/v, o_proj, gate/up + SiLU, down, lm_head) through the
    kernel - TritonOps with a policy that always picks it (split in two) - against the PyTorch twin: same
    logits, cache, hidden; also with o_proj's and down's partials summed by the norm after them (fused_reduce,
    the default)."""
    dt = getattr(torch, dtype)
    target, _ = random_pair(seed=5, vocab_size=97, dtype=dtype, device=DEV)
    P, T, cap = 20, 9, 48
    prompt = torch.arange(1, P + 1, device=DEV) % 97
    ids, pos = torch.arange(40, 40 + T, device=DEV), P + torch.arange(T, device=DEV)
    anc = torch.ones(T, T, dtype=torch.bool, device=DEV).tril()
    start = torch.tensor(P, device=DEV)
    calls = []

    def always(M, N, K, dtype, device, swiglu=False):
        calls.append((M, N, K, swiglu))
        return GemmConfig(16, 32, 32, 2, 4, 2)

    outs = []
    for ops in (fused.TritonOps(gemm_config=always, fused_reduce=fused_reduce), TORCH_OPS):
        cache = target.new_cache(cap)
        target(prompt, torch.arange(P, device=DEV), cache, 0)
        bias = visible_bias(verify_visible(anc, start, cap), dt, group_size(target))
        logits, hidden = target_forward(target, ids, pos, StaticKV(cache), start, bias, (0, 1), ops=ops, attention="sdpa")
        outs.append((logits.float(), hidden.float(), cache.k[:, :, : P + T].float()))
    n_layers = len(target.model.layers)
    assert len(calls) == 4 * n_layers + 1 and sum(c[3] for c in calls) == n_layers   # 4 GEMMs a layer + lm_head
    tol = dict(rtol=1e-4, atol=1e-4) if dt == torch.float32 else dict(rtol=5e-2, atol=5e-2)
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, **tol)


@kernel_check
@pytest.mark.parametrize("split", [2, 3])
def test_the_norm_summing_a_split_gemms_partials_gives_the_reduce_kernels_bits(dtype, split):
    """TritonOps' fused_reduce (the default): the residual add + RMSNorm reads the split GEMM's fp32 partials
    itself - the same sum in the same order as _gemm_split_reduce, so the same bits as the reduce-then-add
    path (fused_reduce=False), and the twin's values."""
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(split)
    M, N, K = 5, 48, 96
    x, inner = torch.randn(M, N, generator=g).to(DEV, dt), torch.randn(M, K, generator=g).to(DEV, dt)
    w, nw = torch.randn(N, K, generator=g).to(DEV, dt), torch.randn(N, generator=g).to(DEV, dt)
    launch = GemmConfig(16, 16, 32, split, 4, 2)
    pick = lambda *a, **k: launch  # noqa: E731
    assert isinstance(gemm.linear_unreduced(inner, w, launch), gemm.SplitSums)
    got = fused.TritonOps(gemm_config=pick).linear_add_rmsnorm(x, inner, w, None, nw, 1e-6)
    unfused = fused.TritonOps(gemm_config=pick, fused_reduce=False).linear_add_rmsnorm(x, inner, w, None, nw, 1e-6)
    assert torch.equal(got[0], unfused[0]) and torch.equal(got[1], unfused[1])
    want = TORCH_OPS.linear_add_rmsnorm(x, inner, w, None, nw, 1e-6)
    for a, b in zip(got, want):
        _close(a, b, dt)


@kernel_check
def test_the_gemm_tuner_times_o_proj_and_down_with_the_norm_that_reads_them(dtype):
    """benchmarks/gpu_gemm_tune.arms: o_proj and down are timed as a forward runs them, the GEMM then the residual
    add + RMSNorm, a split Triton GEMM's partials summed inside that norm (no reduce kernel, which the tuner used to
    time and the forward does not run); q/k/v, gate/up and lm_head as the GEMM alone. cuBLAS's arm and the Triton
    arm give the same values."""
    from pathlib import Path

    from file_module_support import load_file

    from ddtree_bench.engine.gpu.kernels.warm import record

    tune = load_file("gpu_gemm_tune", Path(__file__).resolve().parents[3] / "benchmarks" / "gpu_gemm_tune.py")
    assert tune.RESIDUAL == ("o_proj", "down")
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 96, generator=g).to(DEV, dt)
    split = GemmConfig(16, 16, 32, 2, 4, 2)
    for name, sw in (("down", False), ("o_proj", False), ("qkv", False), ("gate_up", True)):
        ws = [torch.randn(96 if sw else 48, 96, generator=g).to(DEV, dt) for _ in range(2)]
        base, tri = tune.arms(name, x, ws, sw)
        _close(tri(split)(1), base(1), dt)
        kernels = [la.kernel.__name__ if hasattr(la.kernel, "__name__") else la.kernel.fn.__name__
                   for la in record(lambda: tri(split)(0))]
        residual = name in tune.RESIDUAL
        assert ("_gemm_split_reduce" in kernels) is (not residual), (name, kernels)
        assert kernels.count("_rmsnorm_kernel") == (2 if residual else 1), (name, kernels)


def test_a_table_round_trips_and_one_naming_a_removed_kernel_is_refused():
    """A JSON table (DDTREE_GEMM_TABLE) round-trips; its entries are written without `kernel`, as before the field
    existed; a table naming a kernel that is not (or no longer: the TMA forms) in KERNELS is refused in one line."""
    from ddtree_bench.errors import UsageError

    table = {(4096, 4096, False): ((64, GemmConfig(16, 32, 128, 2, 4, 5)), (128, GemmConfig(128, 128, 64, 1, 8, 4)),
                                   (256, None))}
    doc = gemm.table_to_json(table)
    assert all("kernel" not in e["config"] for e in doc["entries"] if e["config"])
    assert gemm.table_from_json(doc) == table
    assert gemm.lookup(gemm.table_from_json(doc), 100, 4096, 4096, False) == GemmConfig(128, 128, 64, 1, 8, 4)
    for name in ("tma-ws", "cutlass"):
        doc["entries"][1]["config"]["kernel"] = name
        with pytest.raises(UsageError):
            gemm.table_from_json(doc)
    builtin = gemm.table_to_json(gemm.H200_TABLE)["entries"]   # the default table: pointer tiles only, written as before
    assert all(e["config"] is None or set(e["config"]) == {"block_m", "block_n", "block_k", "split_k", "warps", "stages"}
               for e in builtin)


def test_the_tuners_candidates_never_spill_their_accumulators_and_fit_shared_memory():
    """benchmarks/gpu_gemm_tune.candidates: weight tiles of 32-128 rows only, no candidate's fp32 accumulators over
    ACC_REGS registers a thread (SwiGLU keeps two: its 128 x 128 tile only on 8 warps, its 128 x 64 on 4 or 8),
    and every candidate's pipeline fits the SM's shared memory."""
    from pathlib import Path

    from file_module_support import load_file

    tune = load_file("gpu_gemm_tune", Path(__file__).resolve().parents[3] / "benchmarks" / "gpu_gemm_tune.py")
    for block_m in (16, 32, 64, 128):
        for sw in (False, True):
            cands = tune.candidates(block_m, sw)
            assert cands and all(c.smem_bytes(sw) <= tune.SMEM_BYTES for c in cands)
            assert {c.block_n for c in cands} <= {32, 64, 128}
            assert all((2 if sw else 1) * c.block_m * c.block_n <= tune.ACC_REGS * 32 * c.warps for c in cands)
    assert {c.warps for c in tune.candidates(128, True) if c.block_n == 128} == {8}
    assert {c.warps for c in tune.candidates(128, True) if c.block_n == 64} == {4, 8}
