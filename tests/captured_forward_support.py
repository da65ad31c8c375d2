"""Shared by the GPU tests of features that must not change a bit (kernels/experimental.py's): one bf16 verify
forward of a random target (4096-token vocabulary, a 40-token prefix, 17 chained tokens) with the fused ops,
captured in a CUDA graph and replayed with DDTREE_GPU_EXPERIMENTAL set to a given value. Needs CUDA."""

from __future__ import annotations

import torch

from ddtree_bench.engine.gpu.kernels import experimental


def captured_verify(monkeypatch, flag: str, seed: int, ops) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, the K the forward wrote) of the replayed graph with DDTREE_GPU_EXPERIMENTAL=flag; ops: the
    fused ops to run it with (fused.TritonOps)."""
    from ddtree_bench.engine.gpu.forward import StaticKV, group_size, target_forward, visible_bias
    from ddtree_bench.engine.gpu.tree_ops import verify_visible
    from ddtree_bench.engine.loading import random_pair

    monkeypatch.setenv(experimental.ENV, flag)
    target, _ = random_pair(seed=seed, vocab_size=4096, dtype="bfloat16", device="cuda")
    P, T, cap = 40, 17, 128
    ids, pos = torch.arange(40, 40 + T, device="cuda"), P + torch.arange(T, device="cuda")
    anc = torch.ones(T, T, dtype=torch.bool, device="cuda").tril()
    start = torch.tensor(P, device="cuda")
    cache = target.new_cache(cap)
    target(torch.arange(1, P + 1, device="cuda"), torch.arange(P, device="cuda"), cache, 0)
    bias = visible_bias(verify_visible(anc, start, cap), torch.bfloat16, group_size(target))
    run = lambda: target_forward(target, ids, pos, StaticKV(cache), start, bias, (), ops=ops)[0]  # noqa: E731
    run()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        logits = run()
    g.replay()
    torch.cuda.synchronize()
    return logits.clone(), cache.k[:, :, : P + T].clone()
