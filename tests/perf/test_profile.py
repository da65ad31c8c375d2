"""The per-kernel profile (perf/profile.py) and its tables (perf/tables.py): the family rule on real
kernel names, the per-call arithmetic (ms, launches, share, idle gap), a real CPU profile of ATen ops,
and bench-engine's verify curve with --profile on a CPU."""

from __future__ import annotations

import pytest
import torch

from ddtree_bench.perf.profile import FAMILIES, family, kernel_gaps, kernel_profile, profile_kernels
from ddtree_bench.perf.tables import profile_tables


@pytest.mark.parametrize("name,fam", [
    ("nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm>", "gemm"),
    ("_live_attn_kernel", "attention"), ("_combine_kernel", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "attention"),
    ("_rmsnorm_kernel", "layer_ops"), ("_qkv_rope_kernel", "layer_ops"), ("_qkv_rope_tiles_kernel", "layer_ops"),
    ("_silu_mul_kernel", "layer_ops"), ("_gemm_split_reduce", "gemm"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "elementwise"),
    ("aten::mm", "gemm"), ("aten::copy_", "elementwise"), ("_compile_kernel", "other"),
])
def test_family_names_each_kernel_kind(name, fam):
    assert family(name) == fam


def test_fold_is_per_call_sorted_and_shares_sum_to_one():
    events = [("gemm_a", 300.0, 1), ("gemm_a", 300.0, 1), ("_rmsnorm_kernel", 50.0, 4), ("_live_attn_kernel", 250.0, 2)]
    p = kernel_profile(events, reps=2, source="graph", wall_ms=0.6)
    assert [k.name for k in p.kernels] == ["gemm_a", "_live_attn_kernel", "_rmsnorm_kernel"]
    assert p.kernels[0].ms == pytest.approx(0.3) and p.kernels[0].launches == 1.0
    assert p.kernels[2].ms == pytest.approx(0.025) and p.kernels[2].launches == 2.0
    assert p.kernel_ms == pytest.approx(0.45)
    assert sum(k.share for k in p.kernels) == pytest.approx(1.0)
    assert p.families_ms["gemm"] == pytest.approx(0.3) and p.families_ms["attention"] == pytest.approx(0.125)
    assert set(p.families_ms) == set(FAMILIES)
    assert p.gap_ms == pytest.approx(0.15)
    d = p.to_dict(top=1)
    assert len(d["kernels"]) == 1 and d["kernels_total"] == 3


def test_gaps_fall_between_kernels_inside_each_call_never_across_calls():
    """Two replays of [a, b, c]: a 0-10, b 12-20 (2 us after a), c 19-25 (starts inside b: no gap); the second
    replay 100 us later (that gap is between calls, not counted) with 3 us before b."""
    spans = [("a", 0, 10), ("b", 12, 20), ("c", 19, 25), ("a", 125, 135), ("b", 138, 146), ("c", 146, 150)]
    gaps = kernel_gaps(spans, reps=2)
    assert [(g.after, g.before) for g in gaps] == [("a", "b"), ("b", "c")]
    assert gaps[0].ms == pytest.approx(0.0025) and gaps[0].count == 1.0 and gaps[1].ms == 0.0
    assert kernel_gaps(spans[:5], reps=2) == []   # the spans do not split into two equal calls
    p = kernel_profile([(n, e - s, 1) for n, s, e in spans], reps=2, source="graph", wall_ms=0.05, spans=spans)
    assert p.gaps_ms == pytest.approx(0.0025) and p.gaps == gaps
    text = profile_tables({"graph": {16: p.to_dict(top=5)}})
    assert "idle between kernels (graph, n = 16)" in text and "2.5" in text   # us each of the a -> b pair
    assert kernel_profile([("a", 1.0, 1)], reps=1, source="cpu").gaps_ms is None


def test_a_cpu_profile_names_the_matmul_and_the_tables_show_it():
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    p = profile_kernels(lambda: torch.softmax(a @ b, dim=-1), torch.device("cpu"), reps=3, wall_ms=1.0)
    assert p.source == "cpu" and p.reps == 3
    names = {k.name: k for k in p.kernels}
    assert "aten::mm" in names and names["aten::mm"].family == "gemm" and names["aten::mm"].launches == 1.0
    assert p.families_ms["gemm"] > 0 and sum(k.share for k in p.kernels) == pytest.approx(1.0)
    text = profile_tables({"graph": {64: p.to_dict(top=5)}})
    assert "verify profile (graph)" in text and "top kernels (graph, n = 64)" in text and "aten::mm" in text
    assert "idle between kernels" not in text   # a CPU profile has no device spans


def test_verify_curve_with_profile_on_a_cpu():
    from ddtree_bench.engine.loading import random_pair
    from ddtree_bench.perf.bench import verify_curve

    target, drafter = random_pair(seed=1, vocab_size=64)
    out = verify_curve(target, drafter.target_layer_ids, 20, [1, 8], torch.device("cpu"), graphs=True, reps=2,
                       profile=True, profile_reps=2, profile_top=4)
    prof = out["profile"]["graph"]
    assert set(prof) == {1, 8} and set(out["eager"]) == {1, 8}
    for n, p in prof.items():
        assert p["source"] == "cpu" and len(p["kernels"]) == 4 and p["families_ms"]["gemm"] > 0
        assert p["wall_ms"] == out["eager"][n]
    # the GEMM-only floor is profiled too, against its own time: nothing but GEMMs in it
    for n, p in out["profile"]["gemm_only"].items():
        assert p["wall_ms"] == out["gemm_only"][n]
        assert p["families_ms"]["gemm"] > 0 and p["families_ms"]["attention"] == 0 and p["families_ms"]["layer_ops"] == 0


def test_bench_engine_profiles_after_its_timed_rounds():
    """run_bench with profile: the profile pass comes after every timed round (torch.profiler's hooks outlive it
    and slowed later rounds on an H200), and the profile covers every --verify-tokens n."""
    from ddtree_bench.perf.bench import BenchSpec, run_bench

    steps: list[str] = []
    spec = BenchSpec(budgets=[16], rounds=1, verify_tokens=[1, 4], prefix_len=16, plain=False, e2e=False,
                     build_table=False, profile=True)
    res = run_bench(spec, progress=steps.append)
    assert set(res["verify_profile"]["graph"]) == {1, 4}
    last_round = max(i for i, s in enumerate(steps) if s.startswith("rounds"))
    assert steps.index("verify profile") > last_round


def test_the_profile_table_gives_the_attention_kernels_their_flop_rate():
    """The 8B shape at n = 256 after 1024 prefix tokens: 4 x 36 x 32 x 128 x 256 x 1024 = 154.6 GFLOP of prefix
    attention; 0.787 ms of attention kernels (an H100's profile, 2026-12-07) is 196.5 TFLOP/s."""
    from ddtree_bench.perf.roofline import AttentionShape

    shape = AttentionShape(layers=36, q_heads=32, head_dim=128, prefix_len=1024)
    assert shape.flops(256) == pytest.approx(154.6e9, rel=1e-3)
    row = {"source": "graph", "wall_ms": 8.69, "kernel_ms": 8.39, "gap_ms": 0.3, "kernels": [],
           "families_ms": {"gemm": 6.94, "attention": 0.787, "layer_ops": 0.61}}
    text = profile_tables({"graph": {256: row, 1: {**row, "families_ms": {"gemm": 5.8}}}}, attention_flops=shape.flops)
    head = next(ln for ln in text.splitlines() if ln.startswith("tokens"))
    assert head.split()[-2:] == ["attn", "TFLOP/s"] and "attn TFLOP/s = the prefix's attention FLOPs" in text
    rows = {ln.split()[0]: ln.split() for ln in text.splitlines() if ln[:1].isdigit()}
    assert rows["256"][-1] == "196.50" and rows["1"][-1] == "-"   # no attention kernels timed: no rate
    assert "attn" not in profile_tables({"graph": {256: row}})
