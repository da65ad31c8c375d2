"""FastLoop._warm_round on a CPU, no GPU: recording a first round's stages on a stand-in tree compiles every Triton
variant a real round of that width launches after its tree build (perf/round_variants.py records one independently,
the slow twin), and changes none of the loop's state (the one real write, the draft logits, is put back). On a GPU
the suite's tests/engine/gpu/test_fastloop_cuda.py checks the end of it: a new bucket's first round compiles nothing.
"""

from __future__ import annotations

import pytest
import torch

from ddtree_bench.engine.gpu.kernels import common


def _jit_kernels() -> bool:
    if common.triton is None:
        return False
    from triton.runtime.jit import JITFunction

    from ddtree_bench.engine.gpu.kernels import argmax

    return isinstance(argmax._span_kernel, JITFunction)


pytestmark = pytest.mark.skipif(not _jit_kernels(), reason="needs Triton's JIT kernels (installed, TRITON_INTERPRET unset)")

SMALL = {"vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 8,
         "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64}


@pytest.fixture
def fused_cpu_loop(monkeypatch):
    """A FastLoop on a small bf16 Qwen3-8B-shaped pair whose rounds would take the fused Triton path (ops, tree ops,
    attention kernels), every launch recorded: compile_launches collects instead of compiling, a launch that ran
    fails the test."""
    from triton.runtime.jit import JITFunction

    from ddtree_bench.engine.generate import Engine
    from ddtree_bench.engine.gpu import loop as fast
    from ddtree_bench.engine.gpu.kernels import attention, tree_attention, warm
    from ddtree_bench.engine.gpu.kernels.layer_ops import TritonOps
    from ddtree_bench.perf.round_variants import h200_gemm_table
    from ddtree_bench.perf.shapes import SHAPES, random_shaped_pair

    def ran(self, *args, **kwargs):
        raise AssertionError(f"{self.fn.__name__} was launched, not recorded")

    compiled = []
    monkeypatch.setattr(JITFunction, "run", ran)
    monkeypatch.setattr(warm, "compile_launches", lambda launches, device, per="kernel": compiled.extend(launches))
    monkeypatch.setattr(fast.FastLoop, "_fused_round", lambda self: True)
    monkeypatch.setattr(fast.FastLoop, "fused_tree_ops", property(lambda self: True))
    monkeypatch.setattr(fast.FastLoop, "ops", property(lambda self: TritonOps(gemm_config=h200_gemm_table)))
    monkeypatch.setattr(attention, "available", lambda device: True)
    monkeypatch.setattr(tree_attention, "available", lambda device: True)
    target, drafter = random_shaped_pair({**SHAPES["qwen3-8b"], **SMALL}, dtype="bfloat16", device="cpu")
    loop = Engine(target, drafter, cuda_graphs=True).fast_loop()
    loop._ensure(100 + 16 + 2 * 16 + 17 + 1)
    return loop, compiled


def _state(loop) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in [("k", loop.tcache.k), ("v", loop.tcache.v), ("dk", loop.dcache.k),
                                            ("dv", loop.dcache.v), ("dlogits", loop.dlogits), ("ctx", loop.ctx),
                                            ("start", loop.start), ("ctx_start", loop.ctx_start), ("bonus", loop.bonus)]}


@pytest.mark.parametrize("width", [17, 65])
@pytest.mark.parametrize("guard", [False, True])
def test_the_warm_records_every_variant_of_a_tree_round_and_changes_no_state(fused_cpu_loop, width, guard):
    from ddtree_bench.engine.gpu.kernels.variants import variants_of
    from ddtree_bench.perf.round_variants import round_variants

    loop, compiled = fused_cpu_loop
    loop.dlogits.normal_()
    before = _state(loop)
    with torch.inference_mode():
        loop._warm_round("ddtree", width, True, guard, ctx_rows=100)
    after = _state(loop)
    assert all(torch.equal(before[k], after[k]) for k in before), [k for k in before if not torch.equal(before[k], after[k])]
    got = set(variants_of(compiled))
    want = round_variants(loop.target, width, prefix=100, new_tokens=loop.capacity - 100 - width, L=loop.L,
                          ctx_layers=len(loop.proposer.target_layer_ids), block=loop.proposer.block_size)
    commits = {"_commit_rows_kernel", "_commit_state_kernel"}   # the twin commits unguarded (no builder flag)
    missing = [k[1] for k in want if k not in got and (not guard or k[1] not in commits)]
    assert missing == []
    assert guard == any(k[1] in commits and k not in want for k in got)   # GUARD, a compile-time constant
    names = {k[1] for k in got}
    assert {"_compile_kernel", "_walk_kernel", "_commit_rows_kernel", "_span_kernel", "_rmsnorm_kernel"} <= names
    assert "_live_attn_kernel" in names   # the drafter's (and a small tree's) attention: the draft was recorded too


def test_an_ar_warm_records_its_verify_and_argmax_and_commits_nothing(fused_cpu_loop):
    from ddtree_bench.engine.gpu.kernels.variants import variants_of
    from ddtree_bench.perf.round_variants import round_variants

    loop, compiled = fused_cpu_loop
    before = _state(loop)
    with torch.inference_mode():
        loop._warm_round("ar", 1, True, False)
    assert all(torch.equal(before[k], t) for k, t in _state(loop).items())
    got = set(variants_of(compiled))
    want = round_variants(loop.target, 1, prefix=100, new_tokens=loop.capacity - 101)   # the same cache size
    assert [k[1] for k in want if k not in got] == []
    assert not {k[1] for k in got} & {"_commit_rows_kernel", "_commit_state_kernel", "_compile_kernel"}


def test_an_ar_warm_on_a_loop_without_a_drafter_records_its_verify(fused_cpu_loop):
    """The batched loop's solo loop for AR has no proposer (no draft logits to keep): its warm records as one with."""
    from ddtree_bench.engine.gpu.loop import FastLoop
    from ddtree_bench.engine.gpu.kernels.variants import variants_of
    from ddtree_bench.perf.round_variants import round_variants

    with_drafter, compiled = fused_cpu_loop
    loop = FastLoop(with_drafter.target, None, graphs=True)
    loop._ensure(with_drafter.capacity)
    with torch.inference_mode():
        loop._warm_round("ar", 1, True, False)
    got = set(variants_of(compiled))
    want = round_variants(loop.target, 1, prefix=100, new_tokens=loop.capacity - 101)
    assert got and [k[1] for k in want if k not in got] == []


def test_switched_off_or_off_the_fused_path_the_warm_records_nothing(fused_cpu_loop, monkeypatch):
    from ddtree_bench.engine.gpu import loop as fast

    loop, compiled = fused_cpu_loop
    monkeypatch.setattr(fast, "WARM_ROUND", False)
    loop._warm_round("ddtree", 17, True, True)
    monkeypatch.setattr(fast, "WARM_ROUND", True)
    monkeypatch.setattr(fast.FastLoop, "_fused_round", lambda self: False)
    loop._warm_round("dflash", 16, True, False)
    assert compiled == []
