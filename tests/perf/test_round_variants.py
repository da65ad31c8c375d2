"""perf/round_variants.py: every kernel of a fast-loop round is recorded, none run, and auto's choices show.

The cold-start benchmark (benchmarks/triton_compile_time.py --forward) counts what each new budget compiles
from these recordings; a kernel launched around `warm.launch` would be missing from its table (here it
would run, and the patched JITFunction.run fails the test)."""

from __future__ import annotations

import pytest

from ddtree_bench.engine.gpu.kernels import common



def _jit_kernels() -> bool:
    if common.triton is None:
        return False
    from triton.runtime.jit import JITFunction

    from ddtree_bench.engine.gpu.kernels import argmax

    return isinstance(argmax._span_kernel, JITFunction)


pytestmark = pytest.mark.skipif(not _jit_kernels(), reason="needs Triton's JIT kernels (installed, TRITON_INTERPRET unset)")


@pytest.fixture(scope="module")
def target():
    from ddtree_bench.perf.shapes import SHAPES, random_shaped_pair

    small = {**SHAPES["qwen3-8b"], "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
             "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64}
    return random_shaped_pair(small, dtype="bfloat16", device="cpu", with_drafter=False)[0]


@pytest.fixture
def nothing_runs(monkeypatch):
    from triton.runtime.jit import JITFunction

    def run(self, *args, **kwargs):
        raise AssertionError(f"{self.fn.__name__} was launched, not recorded")

    monkeypatch.setattr(JITFunction, "run", run)


def _names(target, n: int, **kw) -> set[str]:
    from ddtree_bench.perf.round_variants import round_variants

    return {key[1] for key in round_variants(target, n, prefix=100, new_tokens=16, **kw)}


TREE_KERNELS = {"_compile_kernel", "_walk_kernel", "_commit_rows_kernel", "_commit_state_kernel"}


def test_an_ar_round_records_the_live_slot_attention_and_no_tree_kernels(target, nothing_runs):
    names = _names(target, 1)
    assert {"_rmsnorm_kernel", "_qkv_rope_kernel", "_live_attn_kernel", "_span_kernel", "_pick_kernel"} <= names
    assert not names & (TREE_KERNELS | {"_tree_attn_kernel"})


def test_a_tree_round_records_the_tree_kernels_and_auto_switches_attention_and_rope_by_size(target, nothing_runs):
    from ddtree_bench.engine.gpu.kernels.layer_ops import ROPE_TILES_FROM
    from ddtree_bench.engine.gpu.kernels.tree_attention import TREE_MIN_ROWS

    group = 8 // 2
    small = TREE_MIN_ROWS // group - 1                 # folded rows just under the tree kernel's band
    big = max(TREE_MIN_ROWS // group, ROPE_TILES_FROM)  # in both bands
    below, above = _names(target, small), _names(target, big)
    assert TREE_KERNELS <= below and TREE_KERNELS <= above
    assert "_live_attn_kernel" in below and "_tree_attn_kernel" not in below
    assert "_tree_attn_kernel" in above and "_live_attn_kernel" not in above
    assert "_qkv_rope_kernel" in below and "_qkv_rope_tiles_kernel" in above and "_qkv_rope_kernel" not in above


def test_the_same_round_records_the_same_variants_and_a_chain_is_a_tree_to_the_kernels(target, nothing_runs):
    from ddtree_bench.perf.round_variants import round_variants

    a = round_variants(target, 16, prefix=100, new_tokens=16)
    assert set(a) == set(round_variants(target, 16, prefix=100, new_tokens=16))
    assert TREE_KERNELS <= {k[1] for k in round_variants(target, 16, prefix=100, new_tokens=16, chain=True)}


def test_the_commit_is_keyed_by_the_cache_depth_it_is_given(target, nothing_runs):
    from ddtree_bench.perf.round_variants import round_variants

    two = {k for k in round_variants(target, 16, prefix=100, new_tokens=16) if k[1] == "_commit_rows_kernel"}
    deep = {k for k in round_variants(target, 16, prefix=100, new_tokens=16, cache_layers=8)
            if k[1] == "_commit_rows_kernel"}
    assert two and deep and two != deep   # 2 x 2 KV heads vs 8 x 2 = 16: divisible by 16, another specialisation
