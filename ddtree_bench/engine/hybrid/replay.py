"""Commits that rebuild a GDN layer's state from per-node inputs, and what each commit costs per node.

* `replay_path` - the exact, memory-lean commit: keep only each node's recurrence inputs (k, v, g,
  beta) and conv input u during the verify; after the walk, step the committed state through the
  accepted path (at most block_size tokens). Exact: the same `delta_step` on the same inputs as the
  verify's per-node states (tests: bit for bit on CPU fp32).
* `replay_all` - what `Cache.crop` leaves (the `gdn-crop` fault injection of target_variants.py): the
  state after EVERY verified node in index order, rejected drafts included.

Memory per tree node (per sequence), summed over the GDN layers (n_gdn):
  full state:  n_gdn * (Hv*dk*dv * bytes(ssm dtype)           the node's recurrent state
                        + conv_dim * bytes(activation dtype))  its conv input (windows are gathered from it)
  replay:      n_gdn * ((Hv*dk + Hv*dv + 2*Hv) * 4             k, v, g, beta in fp32
                        + conv_dim * bytes(activation dtype))
(k is kept after the key-head repeat; at Qwen3.6-27B's shape, 48 GDN layers, Hv 48, dk = dv = 128,
conv_dim 10240, fp32 state, bf16 activations: 144.9 MiB vs 3.2 MiB per node.) During a by-depth verify
under replay only two levels of states are alive, so its peak is (widest two levels) x state, not N x state.
Knows nothing of trees' shapes, attention or models.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ddtree_bench.engine.hybrid.gdn import delta_step


def replay_path(S0: torch.Tensor, k, v, g, beta, path: list[int], ssm_dtype: torch.dtype) -> torch.Tensor:
    """S0 [Hv, dk, dv] stepped through nodes `path` (their k, v, g, beta rows), stored in ssm_dtype after
    each step exactly as the verify stores per-node states."""
    S = S0
    for i in path:
        S, _ = delta_step(S.float()[None], None, k[i:i + 1], v[i:i + 1], g[i:i + 1], beta[i:i + 1])
        S = S[0].to(ssm_dtype)
    return S


def replay_all(S0: torch.Tensor, k, v, g, beta, ssm_dtype: torch.dtype) -> torch.Tensor:
    """The state after every node in index order (rejected ones too): what `Cache.crop` leaves behind."""
    return replay_path(S0, k, v, g, beta, list(range(k.shape[0])), ssm_dtype)


@dataclass(frozen=True)
class NodeMemory:
    """Bytes per tree node per sequence for the two exact commits (formulas in the module docstring)."""

    full_state_bytes: int
    replay_bytes: int


def node_memory(n_gdn: int, Hv: int, dk: int, dv: int, conv_dim: int, ssm_bytes: int = 4, act_bytes: int = 2) -> NodeMemory:
    u = conv_dim * act_bytes
    return NodeMemory(full_state_bytes=n_gdn * (Hv * dk * dv * ssm_bytes + u),
                      replay_bytes=n_gdn * ((Hv * dk + Hv * dv + 2 * Hv) * 4 + u))
