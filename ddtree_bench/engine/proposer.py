"""The DFlash drafter as a proposer (interface.Proposer): step 1 of a round, drafting the block
[bonus, mask x (block_size - 1)] and reading its logits through the target's lm_head.

Both loops use it; tests swap in rigged proposers with the same methods. Knows the drafter and the
target's embedding and head; nothing of trees, caches' layout or graphs.
"""

from __future__ import annotations

import torch

from ddtree_bench.engine.draft import DFlashDrafter
from ddtree_bench.engine.model import Target


class DFlashProposer:
    """propose(ctx, bonus, cache, draft_len, start) -> draft logits [L, V] (interface.Proposer)."""

    def __init__(self, drafter: DFlashDrafter, target: Target):
        self.drafter, self.target = drafter, target

    @property
    def block_size(self) -> int:
        return self.drafter.block_size

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        return self.drafter.target_layer_ids

    def new_cache(self, capacity: int):
        return self.drafter.new_cache(capacity)

    def propose(self, ctx: torch.Tensor, bonus: int, cache, draft_len: int, start: int) -> torch.Tensor:
        dev = ctx.device
        block = torch.full((self.block_size,), self.drafter.mask_token_id, dtype=torch.long, device=dev)
        block[0] = bonus
        h = self.drafter(ctx, self.target.embed(block), cache, draft_len, start)
        return self.target.lm_head(h[1:])  # [L, V]
