"""The batched tree build on a GPU: every slot's tree equals the per-slot PyTorch builder's on the Qwen3
vocabulary (V = 151,936, L = 15), with the Triton top-K selection (the default on CUDA) and the torch
one, and the slotted Triton builds of the batched loop, on random, one-hot and coarse bf16 logits, eager and
replayed from a CUDA graph. Needs CUDA; skips cleanly without it (test_batch_tree.py carries the CPU equality
tests; test_tree_kernels_triton.py the slotted kernels' under Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from ddtree_bench.engine.gpu.batch_tree import BatchTreeBuilder
from ddtree_bench.engine.gpu.graphs import Stage
from ddtree_bench.engine.tree_vector import StaticTreeBuilder
from triton_support import tree_logits

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
L, V = 15, 151_936


def logits(C: int, seed: int) -> torch.Tensor:
    kinds = ("random", "onehot", "coarse")
    return torch.stack([tree_logits(kinds[i % 3], L, V, seed + i) for i in range(C)]).to("cuda", torch.bfloat16)


def per_slot(x: torch.Tensor, budget: int) -> list[list[list[int]]]:
    one = StaticTreeBuilder(L, V, budget, "cuda")
    return [[t.tolist() for t in one(x[c])] for c in range(x.shape[0])]


@pytest.mark.parametrize("budget", [16, 128, 512])
@pytest.mark.parametrize("select", ["auto", "fused", "torch"])
def test_every_slot_equals_the_per_slot_builder_on_cuda(budget, select):
    """fused: the batched loop's builder (logits_dtype given), whose log-probs take kernels/normalisers.py's one pass,
    which must hold on this GPU (else the loop silently keeps the slower twin)."""
    b = BatchTreeBuilder(L, V, budget, "cuda", select="auto" if select == "fused" else select,
                         logits_dtype=torch.bfloat16 if select == "fused" else None)
    assert b.triton == (select != "torch")
    assert b.fused_dtype == (torch.bfloat16 if select == "fused" else None)
    for C in (1, 5, 16):
        x = logits(C, budget + C)
        want = per_slot(x, budget)
        got = b(x)
        assert [[t.tolist() for t in got.slot(c)] for c in range(C)] == want
        x2 = x.clone()
        stage = Stage(lambda: b(x2), torch.device("cuda"))
        stage.run()
        x2.copy_(logits(C, 99 + budget))                  # new logits into the captured input: a replay builds their trees
        replayed = stage.run()
        assert [[t.tolist() for t in replayed.slot(c)] for c in range(C)] == per_slot(x2, budget)


@pytest.mark.parametrize("budget", [16, 64, 256, 1024])
def test_slotted_kernels_equal_the_per_slot_builder_on_cuda(budget):
    """The batched loop's slotted build at each budget's rule (builders.batched_kernel: the one-block kernel at 16,
    the grid at 64, grid-keys at 256 and 1024; scratch for 16 slots) on the Qwen3 vocabulary in bf16: whenever its
    certificate holds, every slot's tree is the per-slot builder's, eager and replayed from a CUDA graph at C = 1,
    5, 16 (one graph per C, as one per bucket). bf16's coarse and one-hot logits may tie at a pruning boundary and
    raise the flag (then the loop redoes the round exactly): allowed, but not everywhere."""
    from ddtree_bench.engine.gpu import builders

    sb = builders.make_slotted(builders.batched_kernel(budget), L, V, budget, "cuda", 16,
                               exact=BatchTreeBuilder(L, V, budget, "cuda", logits_dtype=torch.bfloat16))   # the loop's
    assert sb.exact.fused_dtype == torch.bfloat16
    certified = []

    def same_if_certified(trees, x) -> None:
        ok = sb.flag.item() == 0
        sb.flag.zero_()
        certified.append(ok)
        if ok:
            assert [[t.tolist() for t in trees.slot(c)] for c in range(x.shape[0])] == per_slot(x, budget)

    for C in (1, 5, 16):
        x = logits(C, 7 * budget + C)
        same_if_certified(sb(x), x)
        x2 = x.clone()
        stage = Stage(lambda: sb(x2), torch.device("cuda"))
        stage.run()   # the capture's warm-up and replay may raise the flag: cleared
        sb.flag.zero_()
        x2.copy_(logits(C, 99 + budget + C))
        same_if_certified(stage.run(), x2)
    assert sum(certified) >= 3, certified
