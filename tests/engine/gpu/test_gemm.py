"""Which weight GEMMs take the Triton kernel (engine/gpu/kernels/gemm.py `config`): the row bands of a table,
cuBLAS for bands it lost, fp32, CPUs and many rows; the table's JSON form (DDTREE_GEMM_TABLE) and what a bad
file gets; the H200 table's own sanity (shapes that fit an SM, bands in order). No GPU needed."""

from __future__ import annotations

import json

import pytest
import torch

from ddtree_bench.engine.gpu.kernels import common, gemm
from ddtree_bench.engine.gpu.kernels.gemm import GemmConfig
from ddtree_bench.errors import UsageError

A, B = GemmConfig(16, 64, 128, 2, 4, 4), GemmConfig(64, 64, 128, 1, 4, 3)
TABLE = {(4096, 4096, False): ((1, A), (16, None), (64, B))}


def test_lookup_follows_the_row_bands_and_a_lost_band_stays_on_cublas():
    pick = lambda M: gemm.lookup(TABLE, M, 4096, 4096, False)  # noqa: E731
    assert pick(1) == A
    assert pick(2) is None and pick(16) is None   # cuBLAS won 2..16: a later band's shape must not cover it
    assert pick(17) == B and pick(64) == B
    assert pick(65) is None                       # above the last band: cuBLAS
    assert gemm.lookup(TABLE, 1, 4096, 4096, True) is None      # the swiglu GEMM is its own entry
    assert gemm.lookup(TABLE, 1, 6144, 4096, False) is None     # an untuned projection


def test_config_keeps_cublas_for_fp32_cpu_and_many_rows():
    assert gemm.config(1, 4096, 4096, torch.float32, "cpu") is None
    assert gemm.config(1, 4096, 4096, torch.bfloat16, "cpu") is None
    assert gemm.config(gemm.GEMM_MAX_ROWS + 1, 4096, 4096, torch.bfloat16, "cuda") is None


def test_the_json_table_round_trips_and_sorts_its_bands():
    doc = gemm.table_to_json(TABLE)
    doc["entries"].reverse()
    assert gemm.table_from_json(json.loads(json.dumps(doc))) == TABLE


@pytest.mark.parametrize("doc", [{}, {"entries": [{"n": 1}]}, {"entries": [{"n": 8, "k": 8, "swiglu": False, "max_rows": 4,
                                                                         "config": {"block_m": 12, "block_n": 64, "block_k": 64}}]},
                                 {"entries": [{"n": 8, "k": 8, "swiglu": False, "max_rows": 4, "config": {"bogus": 1}}]}])
def test_a_malformed_table_is_a_usage_error(doc):
    with pytest.raises(UsageError, match="not a GEMM table"):
        gemm.table_from_json(doc)


def test_the_env_table_is_read_once_and_a_binary_file_is_a_usage_error(tmp_path, monkeypatch):
    good = tmp_path / "t.json"
    good.write_text(json.dumps(gemm.table_to_json(TABLE)))
    monkeypatch.setenv(gemm.TABLE_ENV, str(good))
    assert gemm._env_table() == TABLE
    bad = tmp_path / "b.json"
    bad.write_bytes(b"\x00\xff\x89PNG")
    monkeypatch.setenv(gemm.TABLE_ENV, str(bad))
    with pytest.raises(UsageError, match="cannot read it as JSON"):
        gemm._env_table()


def test_merged_adds_a_band_between_the_built_in_ones_and_replaces_a_band_it_names_again():
    key, new, other = (12288, 4096, True), gemm.GemmConfig(32, 32, 128, 1, 4, 3), gemm.GemmConfig(16, 64, 128, 1, 4, 3)
    base = {key: ((16, gemm.GemmConfig(16, 32, 128, 1, 4, 3)), (32, None)), (1, 2, False): ((1, None),)}
    table = gemm.merged(base, {key: [(17, new), (16, other)], (3, 4, False): [(64, None)]})
    assert table[key] == ((16, other), (17, new), (32, None)) and table[(1, 2, False)] == base[(1, 2, False)]
    assert table[(3, 4, False)] == ((64, None),)
    assert [gemm.lookup(table, m, 12288, 4096, True) for m in (16, 17, 18)] == [other, new, None]
    assert gemm.table_from_json(gemm.table_to_json(table)) == table   # what --write holds reads back the same


def test_merged_moves_only_the_rows_of_the_new_band():
    """A band tuned at 130 rows (a batch-2 B = 64 verify) over a table whose last band is 32 rows covers 129-130
    rows only: 33-128 keep cuBLAS, as does a projection the table never named below it; a 2-row band takes 2 rows
    from the 16-row band's shape and leaves 1 and 3 alone."""
    low, mid = gemm.GemmConfig(16, 32, 128, 2, 4, 5), gemm.GemmConfig(32, 32, 128, 1, 4, 5)
    wide = gemm.GemmConfig(64, 64, 128, 1, 4, 4)
    o_proj, qkv = (4096, 4096, False), (6144, 4096, False)
    base = {o_proj: ((1, low), (16, low), (32, mid))}
    table = gemm.merged(base, {o_proj: [(2, wide), (130, wide)], qkv: [(130, wide)]},
                        bands=(1, 2, 16, 32, 64, 128, 130))
    at = {m: gemm.lookup(table, m, 4096, 4096, False) for m in (1, 2, 3, 16, 32, 33, 64, 128, 129, 130, 131)}
    assert at == {1: low, 2: wide, 3: low, 16: low, 32: mid, 33: None, 64: None, 128: None, 129: wide, 130: wide,
                  131: None}
    assert [gemm.lookup(table, m, *qkv) for m in (1, 64, 128, 129, 130, 131)] == [None] * 3 + [wide] * 2 + [None]


@pytest.mark.parametrize("table", ["H200_TABLE", "H100_TABLE"])
def test_every_builtin_table_entry_fits_an_sm_and_its_bands_rise(table):
    for (n, k, swiglu), bands in getattr(gemm, table).items():
        rows = [r for r, _ in bands]
        assert rows == sorted(set(rows)) and rows[-1] <= gemm.GEMM_MAX_ROWS
        for _, c in bands:
            if c is not None:
                assert c.smem_bytes(swiglu) <= 227 * 1024 and c.block_m & (c.block_m - 1) == 0


def _jit_kernels() -> bool:
    try:
        from triton.runtime.jit import JITFunction
    except Exception:
        return False
    return isinstance(gemm._gemm_kernel, JITFunction)   # not Triton's interpreter


jit_only = pytest.mark.skipif(not _jit_kernels(), reason="needs Triton's JIT kernels (installed, TRITON_INTERPRET unset)")


@jit_only
def test_warm_linears_records_each_projections_gemm_per_row_count_and_warms_per_variant(monkeypatch):
    """fused.warm_linears (the fast loop's before a new budget's first verify) records, not runs, the GEMM
    launches of every merged projection and lm_head at each row count, and compiles them a thread per variant."""
    from ddtree_bench.engine.gpu import fused
    from ddtree_bench.engine.gpu.kernels import warm
    from ddtree_bench.engine.loading import random_pair

    target, _ = random_pair(seed=1, vocab_size=97)
    fused.merge_projections(target)
    seen = []
    monkeypatch.setattr(warm, "warm", lambda fn, device, per="kernel": seen.append((per, warm.record(fn))) or 0)
    ops = fused.TritonOps(gemm_config=lambda M, N, K, dtype, device, swiglu=False: GemmConfig(16, 16, 32, 2 if swiglu else 1, 4, 2))
    fused.warm_linears([target, target], ops, [1, 17], "cpu")
    (per, launches), = seen
    assert per == "variant"
    kernels = [la.kernel for la in launches]
    # per row count: q/k/v, o_proj, down, lm_head one launch each, gate/up + SiLU split in two (kernel + reduce)
    assert kernels.count(gemm._gemm_kernel) == 2 * 5 and kernels.count(gemm._gemm_split_reduce) == 2
    assert fused.warm_linears([target], fused.TORCH_OPS, [1], "cpu") == 0 and len(seen) == 1   # the twin has none


@jit_only
def test_variant_key_follows_tritons_integer_specialisations():
    from ddtree_bench.engine.gpu.kernels import warm

    x = torch.empty(4, 32)
    key = lambda m, t=x: warm.variant_key(warm.Launch(gemm._gemm_kernel, (1,), (t, m), {"BLOCK_M": 16}))  # noqa: E731
    assert key(17) == key(33) != key(16) == key(48)   # multiples of 16 compile apart
    assert key(1) != key(17)                          # and 1
    assert key(17) != key(17, x.double())             # and another dtype


@jit_only
def test_variant_key_groups_gemm_launches_as_tritons_binder_does():
    """warm.variant_key (the engine's cheap key) against kernels/variants.py (Triton's own binder for sm_90):
    the table's GEMM launches at the row counts a run meets fall into the same groups under both."""
    from ddtree_bench.engine.gpu.kernels import warm
    from ddtree_bench.engine.gpu.kernels.variants import variants_of

    w, gu = torch.empty(64, 96), torch.empty(128, 96)
    launches = []
    for m in (1, 15, 16, 17, 33, 48):
        for c in (GemmConfig(16, 32, 32, 1, 4, 2), GemmConfig(16, 32, 32, 3, 4, 2)):
            x = torch.empty(m, 96)
            launches += warm.record(lambda: (gemm.linear(x, w, c), gemm.swiglu(x, gu, c)))
    ours = [warm.variant_key(la) for la in launches]
    binder = [next(iter(variants_of([la]))) for la in launches]
    partition = lambda ks: sorted(sorted(i for i, k in enumerate(ks) if k == key) for key in set(ks))  # noqa: E731
    assert partition(ours) == partition(binder)
    assert len(set(ours)) == len(variants_of(launches)) > 4   # M = 1, 16/48 and the rest compile apart


@pytest.fixture
def card(monkeypatch):
    """card(name, capability, env=None): gemm sees a CUDA device of that name and capability (Triton present),
    DDTREE_GEMM_TABLE set to env or unset; the cached per-device table and card check are cleared before and after."""
    def set_card(name: str, capability: tuple[int, int], env: str | None = None) -> None:
        if env:
            monkeypatch.setenv(gemm.TABLE_ENV, env)
        else:
            monkeypatch.delenv(gemm.TABLE_ENV, raising=False)
        monkeypatch.setattr(gemm, "triton", object())
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: name)
        gemm.builtin_table.cache_clear()
        common._is_h100_sxm.cache_clear()
        common._is_h200.cache_clear()

    yield set_card
    gemm.builtin_table.cache_clear()
    common._is_h100_sxm.cache_clear()
    common._is_h200.cache_clear()


@pytest.mark.parametrize("name, capability, h100, tuned", [
    ("NVIDIA H100 80GB HBM3", (9, 0), True, True), ("NVIDIA H200", (9, 0), False, True),
    ("NVIDIA H200 NVL", (9, 0), False, True), ("NVIDIA GH200 480GB", (9, 0), False, False),
    ("NVIDIA H100 PCIe", (9, 0), False, False), ("NVIDIA A100-SXM4-80GB", (8, 0), False, False)])
def test_the_cards_the_launch_defaults_were_measured_on(card, name, capability, h100, tuned):
    """is_h100_sxm (its GEMM table, cuBLASLt) and is_tuned_hopper (the few-row PDL and the narrow tree tiles: the H100
    SXM and the H200) answer by the device's name and capability: not a GH200, an H100 PCIe or an older card, never
    a CPU."""
    card(name, capability)
    assert (common.is_h100_sxm("cuda:0"), common.is_tuned_hopper("cuda:0")) == (h100, tuned)
    assert not common.is_tuned_hopper("cpu") and not common.is_h100_sxm("cpu")


@pytest.mark.parametrize("name, capability, table", [
    ("NVIDIA H100 80GB HBM3", (9, 0), "H100_TABLE"), ("NVIDIA H200", (9, 0), "H200_TABLE"),
    ("NVIDIA H100 PCIe", (9, 0), "H200_TABLE"), ("NVIDIA A100-SXM4-80GB", (8, 0), None)])
def test_each_card_takes_its_own_table(card, name, capability, table):
    """An H100 SXM runs the table tuned on one, every other sm_90 card the H200's (as before the H100's existed), and
    other cards cuBLAS: the same 17-row down projection gets three answers."""
    card(name, capability)
    got = gemm.config(17, 4096, 12288, torch.bfloat16, "cuda:0")
    want = None if table is None else gemm.lookup(getattr(gemm, table), 17, 4096, 12288, False)
    assert got == want
    assert (gemm.builtin_table("cuda:0") is getattr(gemm, table)) if table else gemm.builtin_table("cuda:0") is None
    assert gemm.lookup(gemm.H100_TABLE, 17, 4096, 12288, False) != gemm.lookup(gemm.H200_TABLE, 17, 4096, 12288, False)


@pytest.mark.parametrize("name, capability, env, want", [
    ("NVIDIA H100 80GB HBM3", (9, 0), None, "H100_TABLE"), ("NVIDIA H200", (9, 0), None, "H200_TABLE"),
    ("NVIDIA A100-SXM4-80GB", (8, 0), None, "none"), ("NVIDIA H200", (9, 0), "t.json", "DDTREE_GEMM_TABLE=t.json")])
def test_results_name_the_table_that_ran(card, name, capability, env, want):
    """bench-engine records which weight-GEMM table its forwards read (gemm.table_name): a file named in the
    environment wins over the card's own; a CPU reads none."""
    card(name, capability, env)
    assert gemm.table_name("cuda:0") == want and gemm.table_name("cpu") == "none"


def test_cublaslt_leaves_a_cpu_gemm_to_pytorch_and_the_blas_choice_alone(monkeypatch):
    from ddtree_bench.engine.gpu.ops import TORCH_OPS

    monkeypatch.setenv("DDTREE_GPU_EXPERIMENTAL", "cublaslt")
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(5, 32, generator=g), torch.randn(48, 32, generator=g)
    before = torch.backends.cuda.preferred_blas_library()
    assert torch.equal(TORCH_OPS.linear(x, w), torch.nn.functional.linear(x, w))
    assert torch.backends.cuda.preferred_blas_library() == before


@pytest.mark.parametrize("h100, env, want", [(True, "", True), (True, "cublaslt-off", False), (False, "", False),
                                             (False, "cublaslt", True), (True, "cublaslt,cublaslt-off", False)])
def test_an_h100_sends_cublas_gemms_through_cublaslt_unless_told_off(h100, env, want, monkeypatch):
    from ddtree_bench.engine.gpu import ops

    monkeypatch.setattr(ops, "is_h100_sxm", lambda dev: h100)
    monkeypatch.setenv("DDTREE_GPU_EXPERIMENTAL", env)
    assert ops.lt_gemms("cuda") is want
    assert ops.lt_gemms("cpu") is False   # never off CUDA
