"""GPU probe: which SDPA kernel the engine's attention gets, and what it costs (Qwen3-8B attention
shape: 32 query heads, 8 KV heads, head_dim 128, bf16). Prints one line per case.

The plain engine's `attend` passes a bool mask with enable_gqa=True, which PyTorch serves with the
math kernel on CUDA; the fast path's `grouped_attend` folds the query group into the query axis and
passes an additive bias, which the memory-efficient kernel accepts. Run: python benchmarks/gpu_probe.py
"""

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ddtree_bench.engine.layers import attend
from ddtree_bench.engine.gpu.forward import grouped_attend, visible_bias
from ddtree_bench.perf.timing import time_fn

dev = torch.device("cuda")
Hq, Hkv, D, S = 32, 8, 128, 2112
torch.manual_seed(0)
k = torch.randn(Hkv, S, D, device=dev, dtype=torch.bfloat16)
v = torch.randn(Hkv, S, D, device=dev, dtype=torch.bfloat16)
for T in (1, 17, 257, 1025):
    q = torch.randn(Hq, T, D, device=dev, dtype=torch.bfloat16)
    vis = (torch.rand(T, S, device=dev) > 0.2)
    vis[:, 0] = True
    bias = visible_bias(vis, torch.bfloat16, Hq // Hkv)
    ref = attend(q, k, v, vis)
    got = grouped_attend(q, k, v, bias)
    err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
    t_plain = time_fn(lambda: attend(q, k, v, vis), dev, reps=20)
    t_grp = time_fn(lambda: grouped_attend(q, k, v, bias), dev, reps=20)
    line = f"T={T:5d} S={S} plain(enable_gqa,bool)={t_plain:.3f} ms grouped(bias)={t_grp:.3f} ms rel_err={err:.2e}"
    for name, be in (("efficient", SDPBackend.EFFICIENT_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                     ("math", SDPBackend.MATH)):
        try:
            with sdpa_kernel([be]):
                t = time_fn(lambda: grouped_attend(q, k, v, bias), dev, reps=10)
            line += f" | grouped[{name}]={t:.3f}"
        except RuntimeError as e:
            line += f" | grouped[{name}]=unavailable"
        try:
            with sdpa_kernel([be]):
                t = time_fn(lambda: attend(q, k, v, vis), dev, reps=10)
            line += f" plain[{name}]={t:.3f}"
        except RuntimeError:
            line += f" plain[{name}]=unavailable"
    print(line, flush=True)
