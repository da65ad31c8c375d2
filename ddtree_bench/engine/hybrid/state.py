"""The target cache of a hybrid model: attention K/V plus, per GDN layer, a state object, and the commit.

`GDNState` (one per GDN layer, one sequence): `conv` [K-1, conv_dim], the last K-1 conv inputs (the
current token completes the window of K), in the activation dtype; `S` [Hv, dk, dv], the recurrent
state, in the config's `mamba_ssm_dtype` (fp32 when absent). transformers keeps K conv columns; K-1 is
all the next token needs.

`HybridCache` holds a `KVCache` over the attention layers only and the GDN states, and `pos`: how many
tokens the GDN states have absorbed. A sequence forward (prefill, an AR step) advances them at once; a
tree forward (verify) leaves them as they were and parks each GDN layer's `TreeStash` here until the
loop calls `commit(start, accepted)` after its walk:
  attention: the accepted path's K/V rows moved down to slots start.. (KVCache.compact);
  GDN, exact (`commit_mode` "full"): S = the last accepted node's own state; "replay": S = the committed
       S stepped through the accepted path (replay.py); either way conv = the last K-1 columns of
       (committed conv columns ++ u of the accepted path);
  GDN, `gdn-crop` (target_variants.py, a fault injection): S and conv as after the whole verified block.
DFlash's chain is a tree with one path: it commits the state at the accepted length the same way.
A recurrent state cannot be rewound: a forward that does not start at `pos` (or 0: a new sequence)
is refused. Knows nothing of layers' weights or of trees' shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ddtree_bench.engine.cache import KVCache
from ddtree_bench.engine.hybrid.replay import replay_all, replay_path
from ddtree_bench.engine.hybrid.tree_verify import TreeStash

COMMIT_MODES = ("full", "replay")


@dataclass
class GDNState:
    conv: torch.Tensor   # [K-1, conv_dim]
    S: torch.Tensor      # [Hv, dk, dv]


class HybridCache:
    def __init__(self, layer_types: tuple[str, ...], kv_heads: int, head_dim: int, capacity: int, conv_dim: int, K: int,
                 Hv: int, dk: int, dv: int, dtype: torch.dtype, ssm_dtype: torch.dtype, device, commit_mode: str = "full",
                 crop: bool = False):
        if commit_mode not in COMMIT_MODES:
            raise ValueError(f"commit_mode must be one of {COMMIT_MODES}")
        attn = [i for i, t in enumerate(layer_types) if t == "full_attention"]
        self.attn_slot = {layer: s for s, layer in enumerate(attn)}
        self.kv = KVCache(max(1, len(attn)), kv_heads, head_dim, capacity, dtype, device)
        self.gdn_layers = [i for i, t in enumerate(layer_types) if t == "linear_attention"]
        self.ssm_dtype = ssm_dtype
        self.states = {i: GDNState(torch.zeros(K - 1, conv_dim, dtype=dtype, device=device),
                                   torch.zeros(Hv, dk, dv, dtype=ssm_dtype, device=device)) for i in self.gdn_layers}
        self.commit_mode, self.crop = commit_mode, crop
        self.pos = 0
        self.pending: dict[int, TreeStash] = {}
        self.pending_start: int | None = None

    # ------------------------------------------------------------------ attention (KVCache's interface)

    @property
    def capacity(self) -> int:
        return self.kv.capacity

    def write(self, layer: int, start: int, k, v) -> None:
        self.kv.write(self.attn_slot[layer], start, k, v)

    def view(self, layer: int, end: int):
        return self.kv.view(self.attn_slot[layer], end)

    def compact(self, start: int, keep: torch.Tensor) -> None:
        self.kv.compact(start, keep)

    # ------------------------------------------------------------------ GDN states

    def begin(self, start: int, tree: bool) -> None:
        """Called by the model before a forward at `start`: 0 starts a new sequence (states zeroed);
        anything else must continue exactly where the states are."""
        self.pending, self.pending_start = {}, None
        if start == 0:
            for st in self.states.values():
                st.conv.zero_()
                st.S.zero_()
            self.pos = 0
        elif start != self.pos:
            raise RuntimeError(f"hybrid cache: the GDN states hold {self.pos} tokens but the forward starts at {start}; "
                               "a recurrent state cannot be rewound (commit the previous verify first)")
        if tree:
            self.pending_start = start

    def advanced(self, n: int) -> None:
        """A sequence forward of n tokens has been absorbed."""
        self.pos += n

    def commit(self, start: int, accepted: list[int]) -> None:
        """After a tree verify at `start`: keep the accepted path (node indices, root first)."""
        a = len(accepted)
        if accepted != list(range(a)):
            self.kv.compact(start, torch.tensor(accepted, device=self.kv.k.device))
        if self.gdn_layers and self.pending_start != start:
            raise RuntimeError(f"hybrid cache: commit at {start} but the pending verify started at {self.pending_start}")
        for layer, stash in self.pending.items():
            st = self.states[layer]
            K1 = st.conv.shape[0]
            if self.crop:
                cols = torch.cat([st.conv, stash.u])
                st.S.copy_(replay_all(st.S, stash.k, stash.v, stash.g, stash.beta, self.ssm_dtype))
            else:
                cols = torch.cat([st.conv, stash.u[accepted]])
                if stash.node_S is not None and self.commit_mode == "full":
                    st.S.copy_(stash.node_S[accepted[-1]])
                else:
                    st.S.copy_(replay_path(st.S, stash.k, stash.v, stash.g, stash.beta, accepted, self.ssm_dtype))
            st.conv.copy_(cols[cols.shape[0] - K1:])
        self.pos = start + a
        self.pending, self.pending_start = {}, None
