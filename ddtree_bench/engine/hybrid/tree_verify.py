"""GDN layers over a verify tree: every node's output from its own root path, without mixing siblings.

A recurrent layer cannot be masked: run over the flattened tree, node i's state would absorb every node
before it in index order, siblings included. Here each node's state comes from its parent's:

  S_node[i] = step(S_node[par[i]] (the committed S for the root), k_i, v_i, g_i, beta_i)
  window_i  = the conv inputs u of the K-1 nearest ancestors of i (oldest first), topped up from the
              committed conv columns, then u_i

* `gdn_tree_by_depth` - the fast exact form: all nodes of one depth take ONE batched `delta_step`
  (gathering their parents' states from the level above), so a layer makes max-depth + 1 sequential
  steps, not N; the conv windows of all nodes are one gather (`TreeShape.window`).
* `gdn_tree_per_node` - the slow, obvious twin: a Python loop over nodes, parents before children,
  each window built by walking parent pointers. Tested bit for bit equal to the fast form (CPU, fp32).
* `gdn_tree_flat` - NEGATIVE CONTROL only: the flattened tree as one sequence (what a 4-D tree mask
  through transformers does to these layers). Wrong whenever the tree branches; the oracle tests
  assert that it fails.

The tree itself is read from the verify mask the loops already build (`tree_shape`): the tree block of
the mask is the ancestor-or-self matrix, so a node's parent is its deepest strict ancestor. Knows
nothing of attention, walks or commits (state.py / replay.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ddtree_bench.engine.hybrid.gdn import GatedDeltaNet, chunked_delta_rule, conv_apply, conv_windows, delta_step

TREE_MODES = ("depth", "node", "flat")


@dataclass
class TreeShape:
    """parents [N] (-1 for the root), depths [N], levels[d] = node ids at depth d (ascending),
    window [N, K] = rows of cat(committed conv columns [K-1], u [N]) each node's conv reads, oldest first."""

    parents: torch.Tensor
    depths: torch.Tensor
    levels: list[torch.Tensor]
    window: torch.Tensor

    @property
    def n(self) -> int:
        return int(self.parents.numel())


def tree_shape(anc: torch.Tensor, K: int) -> TreeShape:
    """From the ancestor-or-self matrix [N, N] (bool, node 0 = root, parents before children)."""
    N = anc.shape[0]
    dev = anc.device
    depths = anc.sum(dim=1) - 1
    strict = anc & ~torch.eye(N, dtype=torch.bool, device=dev)
    score = torch.where(strict, depths[None, :] + 1, torch.zeros((), dtype=depths.dtype, device=dev))
    parents = torch.where(strict.any(dim=1), score.argmax(dim=1), torch.full_like(depths, -1))
    levels = [torch.nonzero(depths == d).squeeze(1) for d in range(int(depths.max()) + 1)] if N else []
    cur = torch.arange(N, device=dev) + (K - 1)
    cols = [cur]
    for _ in range(K - 1):
        node = cur - (K - 1)
        is_node = node >= 0
        p = parents[node.clamp(min=0)]
        cur = torch.where(is_node, torch.where(p >= 0, p + (K - 1), torch.full_like(p, K - 2)), cur - 1)
        cols.append(cur)
    return TreeShape(parents, depths, levels, torch.stack(cols[::-1], dim=1))


@dataclass
class TreeStash:
    """Per node of one GDN layer, what a later commit needs: the conv inputs u [N, C] always, the
    recurrence inputs (k, v, g, beta: fp32) for a replay, and the per-node states [N, Hv, dk, dv] for a
    full-state commit (None under replay: only one depth level of states lives at a time)."""

    u: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    node_S: torch.Tensor | None


def gdn_tree_by_depth(gdn: GatedDeltaNet, conv_state, S0, u, g, beta, shape: TreeShape, keep_states: bool,
                      ssm_dtype: torch.dtype) -> tuple[torch.Tensor, TreeStash]:
    """Outputs o [N, Hv, dv] (fp32) of every node, one batched step per depth."""
    buf = torch.cat([conv_state, u])
    c = conv_apply(conv_windows(buf, shape.window), gdn.conv_weight(), u.dtype)
    q, k, v = gdn.qkv(c)
    N = u.shape[0]
    o = torch.empty_like(v)
    node_S = torch.empty((N,) + tuple(S0.shape), dtype=ssm_dtype, device=u.device) if keep_states else None
    prev_S, prev_ids = S0.float()[None], None
    row_of = torch.full((N,), -1, dtype=torch.long, device=u.device)   # node -> row of the previous level
    for ids in shape.levels:
        par = shape.parents[ids]
        S_in = prev_S.expand(ids.numel(), -1, -1, -1) if prev_ids is None else prev_S[row_of[par]]
        S, o[ids] = delta_step(S_in, q[ids], k[ids], v[ids], g[ids], beta[ids])
        S = S.to(ssm_dtype).float() if ssm_dtype != torch.float32 else S
        if node_S is not None:
            node_S[ids] = S.to(ssm_dtype)
        row_of[ids] = torch.arange(ids.numel(), device=u.device)
        prev_S, prev_ids = S, ids
    return o, TreeStash(u, k, v, g, beta, node_S)


def gdn_tree_per_node(gdn: GatedDeltaNet, conv_state, S0, u, g, beta, parents: list[int],
                      ssm_dtype: torch.dtype) -> tuple[torch.Tensor, TreeStash]:
    """The slow twin: node by node, windows from parent pointers, state from the parent's."""
    K = gdn.K
    w = gdn.conv_weight()
    N = u.shape[0]
    os, qs, ks, vs, states = [], [], [], [], []
    for i in range(N):
        cols, j, back = [u[i]], parents[i], 0
        while len(cols) < K:                       # ancestors first, then the committed columns (newest first)
            if j >= 0:
                cols.append(u[j])
                j = parents[j]
            else:
                back += 1
                cols.append(conv_state[conv_state.shape[0] - back])
        window = torch.stack(cols[::-1], dim=1)[None]          # [1, C, K]
        q, k, v = gdn.qkv(conv_apply(window, w, u.dtype))
        S_in = S0.float()[None] if parents[i] < 0 else states[parents[i]].float()[None]
        S, o = delta_step(S_in, q, k, v, g[i:i + 1], beta[i:i + 1])
        states.append(S[0].to(ssm_dtype))
        os.append(o[0]), qs.append(q[0]), ks.append(k[0]), vs.append(v[0])
    return torch.stack(os), TreeStash(u, torch.stack(ks), torch.stack(vs), g, beta, torch.stack(states))


def gdn_tree_flat(gdn: GatedDeltaNet, conv_state, S0, u, g, beta, ssm_dtype: torch.dtype) -> tuple[torch.Tensor, TreeStash]:
    """NEGATIVE CONTROL: the N nodes as one sequence in index order (siblings mixed). Not exact."""
    N, K = u.shape[0], gdn.K
    buf = torch.cat([conv_state, u])
    idx = torch.arange(N, device=u.device)[:, None] + torch.arange(K, device=u.device)[None, :]
    q, k, v = gdn.qkv(conv_apply(conv_windows(buf, idx), gdn.conv_weight(), u.dtype))
    o, _ = chunked_delta_rule(q, k, v, g, beta, S0.float())
    # per-node "states" along the flat sequence, so a commit installs what this control computed
    states, S = [], S0.float()[None]
    for i in range(N):
        S, _ = delta_step(S, q[i:i + 1], k[i:i + 1], v[i:i + 1], g[i:i + 1], beta[i:i + 1])
        states.append(S[0].to(ssm_dtype))
    return o, TreeStash(u, k, v, g, beta, torch.stack(states))
