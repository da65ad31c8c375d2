"""Shared by the Triton kernel tests: whether Triton is installed (a dev dependency), where the kernels can run
(CUDA, or a CPU under Triton's interpreter with TRITON_INTERPRET=1), the skip mark for everywhere else, and the
logits families the tree tests draw from (random, near-all-ties one-hot, coarse with ties across depths)."""

from __future__ import annotations

import os

import pytest
import torch

from ddtree_bench.engine.gpu import fused


HAVE_TRITON = fused.triton is not None


def _triton_device() -> str | None:
    if not HAVE_TRITON:
        return None
    if torch.cuda.is_available():
        return "cuda"
    return "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else None


DEV = _triton_device()
triton_only = pytest.mark.skipif(DEV is None, reason="needs Triton on CUDA (or TRITON_INTERPRET=1)")


def tree_logits(kind: str, L: int, V: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "random":
        return torch.randn(L, V, generator=g) * 3
    if kind == "onehot":  # almost every logit ties
        x = torch.zeros(L, V)
        x[torch.arange(L), torch.randint(V, (L,), generator=g)] = 5.0
        return x
    return torch.round(torch.randn(L, V, generator=g) * 2) / 2  # coarse: many ties, also across depths
