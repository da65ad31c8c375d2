"""GPU probe: the batched tree build's log-probs at the top-K ids, the PyTorch twin (tree_vector.logprobs_at over
fp32_logits: copy, NaN pass, max, x - max, exp, each slot's sum) against kernels/normalisers.py (max and shifted exp
in one Triton pass, the same sums), at the Qwen3 vocabulary in bf16 over C = 1, 2, 4, 16 slots (C * 15 rows), as
CUDA-graph replays; each line says whether the two gave the same bits, and exact_here's answer per dtype.
Run: python benchmarks/gpu_probe_normalisers.py
"""

import torch

from ddtree_bench.engine.gpu.graphs import replay_ms
from ddtree_bench.engine.gpu.kernels import normalisers
from ddtree_bench.engine.gpu.kernels.topk import topk_ids_fused
from ddtree_bench.engine.tree_vector import fp32_logits, logprobs_at

dev, L, V, K = torch.device("cuda"), 15, 151936, 16
print("exact_here:", {str(dt): normalisers.exact_here("cuda", dt) for dt in (torch.bfloat16, torch.float32)})
print("log-probs at the top-16 ids, ms per call (graph replay): twin, fused, same bits")
for C in (1, 2, 4, 16):
    x = (torch.randn(C, L, V, generator=torch.Generator().manual_seed(C)) * 3).to(dev, torch.bfloat16)
    ids = topk_ids_fused(x.view(C * L, V), K).view(C, L, K)
    twin = logprobs_at(fp32_logits(x), ids)
    fused = normalisers.logprobs_at(x, ids)
    same = torch.equal(twin.view(torch.int32), fused.view(torch.int32))
    t_ms = replay_ms(lambda: logprobs_at(fp32_logits(x), ids))
    f_ms = replay_ms(lambda: normalisers.logprobs_at(x, ids))
    print(f"  C={C:3d} rows={C * L:4d} twin={t_ms:.4f} fused={f_ms:.4f} same={same}", flush=True)
