"""Which Triton variants one fast-loop round launches outside the tree build, found on a machine without a GPU.

`round_variants(target, n, ...)` runs the host code of one round of n tree tokens with every kernel launch
recorded instead of run (kernels/warm.py's `record`, bound as the GPU would key Triton's cache:
kernels/variants.py): the target forward with the fused layer ops, the weight GEMMs as the H200 table picks
them and attention by auto's rule (the live-slot kernel below TREE_MIN_ROWS folded rows, the tree kernel
from there), the argmax over the logits, and for a tree (n > 1) its compile, walk and commit. The cold-start
benchmark (benchmarks/triton_compile_time.py --forward) compiles what each new budget adds; the tests use it
to check that every kernel of a round is recorded (one launched directly would run, and fail, on the CPU).

What it does not know: the tree builders and the top-K (builders.py's own recording), the drafter's forward
(the same at every budget), cuBLAS (not Triton: skipped), and how long anything takes on a GPU. A one-layer
target stands for any depth (every layer launches the same variants); only the commit's cache takes
`cache_layers`, since its layer count is a specialised integer there.
"""

from __future__ import annotations

from unittest import mock

import torch
import torch.nn.functional as F

from ddtree_bench.engine.gpu.forward import StaticKV, group_size, target_forward, visible_bias
from ddtree_bench.engine.gpu.kernels import argmax, attention, gemm, tree_attention, tree_verify
from ddtree_bench.engine.gpu.kernels.layer_ops import TritonOps
from ddtree_bench.engine.gpu.kernels.variants import launched_variants
from ddtree_bench.engine.interface import WalkLayout


def h200_gemm_table(M, N, K, dtype, device, swiglu=False):
    """gemm.config as it answers on an H200 (the tuned table up to GEMM_MAX_ROWS, else cuBLAS), on any device."""
    return gemm.lookup(gemm.H200_TABLE, M, N, K, swiglu) if M <= gemm.GEMM_MAX_ROWS else None


def _tree(n: int, chain: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Parents (1-based) and depths of an n-token tree: a chain (DFlash's block) or the verify curve's tree."""
    if n == 1:
        empty = torch.empty(0, dtype=torch.long)
        return empty, empty
    if chain:
        return torch.arange(n - 1), torch.arange(1, n)
    from ddtree_bench.perf.bench import curve_tree

    par, dep, _ = curve_tree(n, torch.device("cpu"), False)
    return par, dep


def round_variants(target, n: int, prefix: int, new_tokens: int, L: int = 15, chain: bool = False,
                   ctx_layers: int = 5, block: int = 16, cache_layers: int | None = None) -> dict:
    """key -> Variant of every Triton kernel one round of n tokens launches (module docstring) after `prefix`
    cached tokens, the cache sized for `new_tokens` more as the loop sizes it. L: the drafter's depth;
    chain: DFlash's block instead of a tree; ctx_layers / block: the drafter's target layers and block
    (the commit's hidden rows and context buffer); cache_layers: the commit's cache depth (default the target's)."""
    from ddtree_bench.engine.gpu.loop import CAPACITY_ALIGN

    cfg, dt = target.cfg, target.lm_head.weight.dtype
    group = group_size(target)
    capacity = -(-(prefix + new_tokens + n) // CAPACITY_ALIGN) * CAPACITY_ALIGN
    cache = target.new_cache(capacity)
    start = torch.tensor(prefix)
    par, dep = _tree(n, chain)
    tok = torch.randint(cfg.vocab_size, (n - 1,), generator=torch.Generator().manual_seed(n))
    bonus = torch.zeros(1, dtype=torch.long)
    ops = TritonOps(gemm_config=h200_gemm_table)
    hidden_w = ctx_layers * cfg.hidden_size

    def one_round():
        if n > 1:
            ids, pos, _, bias, path = tree_verify.compile_tree(bonus, tok, par, dep, start, capacity, dt, group, L)
            ids.zero_(), pos.fill_(prefix)   # recorded, not run: the host-side embedding and RoPE read them
        else:
            ids, pos, path = bonus, start.reshape(1), None
            bias = visible_bias((torch.arange(capacity) <= start)[None, :], dt, group)
        logits, _ = target_forward(target, ids, pos, StaticKV(cache), start, bias, ops=ops, tree_path=path)
        post = argmax.argmax_rows(logits)
        if n > 1:
            layout = WalkLayout(L)
            walked = tree_verify.walk_tree(ids, par, dep, path, post, layout)
            k = torch.empty(cache_layers or cfg.num_hidden_layers, cfg.num_key_value_heads, capacity, cfg.head_dim,
                            dtype=dt)
            tree_verify.commit_tree(walked, layout, start, torch.zeros((), dtype=torch.long), bonus, k, k.clone(),
                                    torch.empty(n, hidden_w, dtype=dt), torch.empty(block, hidden_w, dtype=dt))

    def cublas(x, w, b=None):   # not a Triton kernel; on the CPU it would take seconds for nothing
        return torch.empty(*x.shape[:-1], w.shape[0], dtype=x.dtype)

    with torch.inference_mode(), mock.patch.object(attention, "available", lambda device: True), \
            mock.patch.object(tree_attention, "available", lambda device: True), mock.patch.object(F, "linear", cublas):
        return launched_variants(one_round)
