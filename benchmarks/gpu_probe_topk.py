"""GPU probe: the per-depth top-K of the draft logits several ways, as replayed CUDA graphs, at the
Qwen3 vocabulary (L = 15 depths, V = 151,936, bf16) and the toy's (V = 272, fp32). Prints one line
per K: PyTorch (`tree_vector.topk_logprobs`: composite keys + int64 topk), Triton "min" (K
min-reductions per chunk), "pruned" (the same on the chunks that can hold the K best only), Triton "threshold" (radix search for the chunk's K-th score, survivors
merged by `_merge_select_kernel`) and "threshold/torch-merge" (the same, survivors merged by one
int64 torch.topk), each checked equal to PyTorch first.
At the Qwen3 vocabulary it also times the threshold selection at chunks of 4,096 and 8,192 tokens.
It is what `kernels/topk.SELECT_MIN_UP_TO` and `CHUNK` are set from. Run: python benchmarks/gpu_probe_topk.py
"""

import torch

from ddtree_bench.engine.gpu.graphs import replay_ms
from ddtree_bench.engine.gpu import _probe
from ddtree_bench.engine.tree_vector import topk_logprobs

dev = torch.device("cuda")
for V, dtype in ((151936, torch.bfloat16), (272, torch.float32)):
    x = (torch.randn(15, V, generator=torch.Generator().manual_seed(0)) * 3).to(dev, dtype)
    print(f"V={V} {dtype}: ms per call (graph replay, median of 20)")
    for k in (1, 8, 16, 32, 64, 128, 256, 512):
        if k > V:
            continue
        ref = topk_logprobs(x, k)
        line = f"  K={k:5d} torch={replay_ms(lambda: topk_logprobs(x, k)):.4f}"
        for sel, merge in (("min", "triton"), ("pruned", "triton"), ("threshold", "triton"), ("threshold", "torch")):
            if sel in ("min", "pruned") and k > 256:
                continue
            got = _probe.topk(x, k, select=sel, merge=merge)
            same = all(torch.equal(a, b) for a, b in zip(got, ref))
            ms = replay_ms(lambda: _probe.topk(x, k, select=sel, merge=merge))
            name = sel + ("/torch-merge" if merge == "torch" else "")
            line += f" {name}={ms:.4f}{'' if same else ' (DIFFERS)'}"
        print(line, flush=True)

x = (torch.randn(15, 151936, generator=torch.Generator().manual_seed(0)) * 3).to(dev, torch.bfloat16)
print("V=151936 bf16, by chunk size: ms per call (graph replay)")
for k in (128, 256):
    ref = topk_logprobs(x, k)
    line = f"  K={k:5d}"
    for sel in ("threshold",):
        for ch in (4096, 8192):
            if sel == "min" and k > 128:
                continue
            got = _probe.topk(x, k, select=sel, chunk=ch)
            same = all(torch.equal(a, b) for a, b in zip(got, ref))
            ms = replay_ms(lambda: _probe.topk(x, k, select=sel, chunk=ch))
            line += f" {sel}@{ch}={ms:.4f}{'' if same else '(DIFFERS)'}"
    print(line, flush=True)

# the batched tree build selects over C * L rows (C slots): ids only, as batch_tree.BatchTreeBuilder calls it
print("V=151936 bf16, ids only, by rows (C * 15): ms per call (graph replay)")
from ddtree_bench.engine.gpu.kernels import topk as _topk_mod  # noqa: E402

for k in (16, 32, 64):
    line = f"  K={k:5d}"
    for rows in (15, 30, 60, 120, 240):
        x = (torch.randn(rows, 151936, generator=torch.Generator().manual_seed(rows)) * 3).to(dev, torch.bfloat16)
        ref = topk_logprobs(x, k)[1]
        for sel in ("min", "pruned", "threshold"):
            got = _topk_mod._topk(x, k, select=sel, with_logprobs=False)[1]
            ms = replay_ms(lambda: _topk_mod._topk(x, k, select=sel, with_logprobs=False))
            line += f" {rows}:{sel}={ms:.4f}{'' if torch.equal(got, ref) else '(DIFFERS)'}"
    print(line, flush=True)
