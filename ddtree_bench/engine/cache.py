"""Preallocated, position-indexed KV cache with tree compaction.

One tensor per K and V of shape [layers, kv_heads, capacity, head_dim]. Slots are written where
tokens are fed (`write`), read up to a frontier the caller keeps as a plain int (`view`), and
rejected slots are never cleared: rolling back means moving the integer (gpt-fast's trick). Tree
verification breaks that trick for siblings, so `compact` first copies the accepted path's rows down
to the frontier. The cache knows nothing of trees or models beyond these shapes.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int, dtype: torch.dtype, device: torch.device):
        shape = (layers, kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [kv_heads, T, head_dim] written to slots start .. start+T-1."""
        end = start + k.shape[1]
        if end > self.capacity:
            raise RuntimeError(f"KV cache overflow: slot {end} > capacity {self.capacity}")
        self.k[layer, :, start:end] = k
        self.v[layer, :, start:end] = v

    def view(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of slots [0, end): [kv_heads, end, head_dim] each."""
        return self.k[layer, :, :end], self.v[layer, :, :end]

    def commit(self, start: int, accepted: list[int]) -> None:
        """After a verify at `start`: keep the accepted path (node indices, root first). A prefix
        [0, 1, ..., a-1] is already in place; anything else is compacted. (A hybrid target's cache,
        engine/hybrid/state.py, also commits its recurrent states here.)"""
        if accepted != list(range(len(accepted))):
            self.compact(start, torch.tensor(accepted, device=self.k.device))

    def compact(self, start: int, keep: torch.Tensor) -> None:
        """Move rows start + keep[i] to start + i, for all layers (keep: LongTensor, increasing, keep[0] = 0).

        A prefix keep = [0, 1, ..., n-1] (a chain, or DFlash) is already in place and moves nothing.
        """
        n = int(keep.numel())
        if n == 0:
            return
        src = keep.to(self.k.device) + start
        # advanced indexing on the right-hand side copies first, so overlapping ranges are safe
        self.k[:, :, start : start + n] = self.k[:, :, src]
        self.v[:, :, start : start + n] = self.v[:, :, src]
