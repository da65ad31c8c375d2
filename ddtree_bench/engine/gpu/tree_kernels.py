"""Whether the fast loop may run the Triton tree kernels (kernels/tree_verify.py: compile, walk, commit; and
the walk's argmax, kernels/argmax.py) on a device: once per device, on a small random tree (and, through the
batched launches, on two slots with a padding one), each must equal its PyTorch twin (tree_ops.ancestors / verify_visible / walk_static / commit_static, forward.visible_bias,
torch.argmax) bit for bit; a failure warns and the loop keeps the twins. The test's kernels are compiled at once
first (kernels/warm.py), since it runs at a process's first round. The gate sits here, beside the
twins, so that the kernels below know nothing of them. Knows nothing of models or graphs.
"""

from __future__ import annotations

import warnings

import torch

from ddtree_bench.engine.gpu.forward import visible_bias
from ddtree_bench.engine.gpu.kernels import argmax, tree_verify
from ddtree_bench.engine.gpu.kernels.common import triton
from ddtree_bench.engine.gpu.kernels.warm import warm
from ddtree_bench.engine.gpu.tree_ops import ancestors, commit_static, verify_visible, walk_static
from ddtree_bench.engine.interface import WalkLayout
from ddtree_bench.engine.tree_vector import StaticTreeBuilder

_CHECKED: dict[str, str | None] = {}   # device -> None (passed) or the failure


def available(device) -> bool:
    """Triton is installed, the device is CUDA, and self_test passed there (checked once per device)."""
    dev = torch.device(device)
    if triton is None or dev.type != "cuda":
        return False
    if str(dev) not in _CHECKED:
        try:
            warm(lambda: self_test(dev), dev, per="variant")   # its kernels compiled at once, then run in turn
            _CHECKED[str(dev)] = self_test(dev)
        except Exception as e:  # pragma: no cover - needs a GPU
            _CHECKED[str(dev)] = f"{type(e).__name__}: {e}"
        if _CHECKED[str(dev)] is not None:
            warnings.warn(f"Triton tree compile/walk unusable, using the PyTorch ops: {_CHECKED[str(dev)]}")
    return _CHECKED[str(dev)] is None


def self_test(dev: torch.device) -> str | None:
    """None if every tree kernel equals its twin on a small random tree on dev, else which one differs first. Every
    kernel runs whatever an earlier one gave (the later ones take the twins' outputs), so the whole test can be
    recorded for `kernels/warm.py` to compile at once."""
    failed: list[str] = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            failed.append(what)

    L, V, B, cap = 6, 5, 20, 64
    tok, par, dep = StaticTreeBuilder(L, V, B, dev)(torch.randn(L, V, generator=torch.Generator().manual_seed(0)).to(dev))
    bonus, start = torch.tensor([3], device=dev), torch.tensor(17, device=dev)
    ids, pos, anc, bias, path = tree_verify.compile_tree(bonus, tok, par, dep, start, cap, torch.float32, 2, L)
    anc_ref = ancestors(par, L)
    check(torch.equal(anc, anc_ref) and torch.equal(bias, visible_bias(verify_visible(anc_ref, start, cap), torch.float32, 2)),
          "compile_tree differs from the PyTorch twin")
    post = torch.cat([tok[:4], torch.zeros(ids.numel() - 4, dtype=torch.long, device=dev)])  # accepts a path of depth >= 1
    walked = walk_static(ids, par, dep, anc_ref, post, L)
    check(torch.equal(tree_verify.walk_tree(ids, par, dep, path, post, WalkLayout(L)), walked), "walk_tree differs from walk_static")
    g = torch.Generator().manual_seed(1)
    state = [torch.tensor(5, device=dev), torch.tensor(1, device=dev), torch.tensor([2], device=dev),
             *(torch.randn(2, 2, cap, 8, generator=g).to(dev) for _ in range(2)),
             torch.randn(ids.numel(), 12, generator=g).to(dev), torch.randn(L + 1, 12, generator=g).to(dev)]
    twin = [t.clone() for t in state]
    tree_verify.commit_tree(walked, WalkLayout(L), *state)
    commit_static(walked, WalkLayout(L), *twin)
    check(all(torch.equal(a, b) for a, b in zip(state, twin)), "commit_tree differs from commit_static")
    two = lambda t: torch.stack([t, t])  # noqa: E731 - the batched launches: slot 1 = slot 0's tree at another frontier
    ids2, _, anc2, bias2, path2 = tree_verify.compile_trees(two(bonus[0]), two(tok), two(par), two(dep),
                                                            torch.stack([start, start + 9]), cap, torch.float32, 2, L)
    bias_9 = visible_bias(verify_visible(anc_ref, start + 9, cap), torch.float32, 2)
    check(torch.equal(anc2[1], anc_ref) and torch.equal(bias2[0], bias) and torch.equal(bias2[1], bias_9),
          "compile_trees differs from compile_tree per slot")
    check(torch.equal(tree_verify.walk_trees(ids2, two(par), two(dep), path2, two(post), WalkLayout(L)), two(walked)),
          "walk_trees differs from walk_tree per slot")
    k2, v2 = (torch.randn(2, 3, 2, cap, 8, generator=g).to(dev) for _ in range(2))
    hid2, ctx2 = torch.randn(2 * ids.numel(), 12, generator=g).to(dev), torch.randn(3, L + 1, 12, generator=g).to(dev)
    s2, cs2, b2 = torch.tensor([5, 9], device=dev), torch.tensor([1, 1], device=dev), torch.tensor([2, 4], device=dev)
    tw = [t.clone() for t in (s2, cs2, b2, k2, v2, ctx2)]
    tree_verify.commit_trees(two(walked), WalkLayout(L), s2, cs2, b2, k2, v2, hid2, ctx2, torch.tensor([1, 0], device=dev))
    for c, live in ((0, 1), (1, 0)):
        w = walked.clone()
        w[0] *= live
        commit_static(w, WalkLayout(L), tw[0][c], tw[1][c], tw[2][c : c + 1], tw[3][:, c], tw[4][:, c],
                      hid2[c * ids.numel() : (c + 1) * ids.numel()], tw[5][c])
    check(all(torch.equal(a, b) for a, b in zip((s2, cs2, b2, k2, v2, ctx2), tw)), "commit_trees differs from commit_static per slot")
    logits = torch.randn(3, 5000, generator=g).round().to(dev, torch.bfloat16)  # with ties
    check(torch.equal(argmax.argmax_rows(logits), logits.argmax(dim=-1)), "argmax_rows differs from torch.argmax")
    return failed[0] if failed else None
