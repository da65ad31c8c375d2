"""Tree compile (verify inputs), tree walk and commit as one or two Triton launches each, for the CUDA fast path.

The PyTorch versions (`tree_ops.ancestors` / `verify_visible` / `forward.visible_bias`,
`tree_ops.walk_static` and `tree_ops.commit_static`) are the twins: same outputs, bit for
bit, tested against each other. In a CUDA graph they cost ~45, ~15 and ~17 small launches a round
(timings: docs/gpu-performance.md).
* `compile_tree`: one program per tree row i (root = 0) and tile of cache columns. It walks i's parent pointers once and
  stores its path (node at each depth 0..L; `path`, [T, L+1]); node j is an ancestor-or-self of i
  iff depth(j) <= depth(i) and path[i, depth(j)] == j. From that it writes the verify ids and
  positions, the ancestor matrix row and the additive attention bias row over every cache slot
  (committed prefix visible, the row's ancestors visible, everything else -inf), repeated per
  query group.
* `walk_tree`: one program. A node matches when its token is the target's pick at its parent; it
  is accepted when every node on its path matches (read from `path`); the accepted nodes form one
  path, written out as `walk_static`'s vector [a, node at depth 0..L, token at depth 0..L, bonus].
* `commit_tree`: one program per (layer, KV head) moves the accepted path's K/V rows down to the
  frontier, more programs gather its context rows; then one program advances the frontier. A
  raised certificate flag (the last walk element, when guarded) makes both no-ops.
Each kernel also runs C trees at once, one per slot of the batched loop (`compile_trees`, `walk_trees`,
`commit_trees`: slot c's programs read and write slot c's rows of every [C, ...] argument, and its
region of a slotted cache [layers, B, Hkv, S, D]); the one-tree functions are those with C = 1, so batch
1 and the batched loop's slots run the same code. Their twins are the PyTorch ops slot by slot.
Needs Triton (CUDA, or the CPU interpreter in tests); knows nothing of models.
"""

from __future__ import annotations

import torch

from ddtree_bench.engine.gpu.kernels.common import _pow2, tl, triton
from ddtree_bench.engine.gpu.kernels.warm import launch
from ddtree_bench.engine.interface import WalkLayout

BC = 1024  # cache columns per inner step

if triton is not None:

    @triton.jit
    def _depth_of(dep_ptr, j, m):
        """Depth of tree rows j (root 0): dep_ptr holds the N non-root depths."""
        return tl.load(dep_ptr + j - 1, mask=m & (j > 0), other=0)

    @triton.jit
    def _compile_kernel(bonus_ptr, tok_ptr, par_ptr, dep_ptr, start_ptr, ids_ptr, pos_ptr, path_ptr, anc_ptr, bias_ptr,
                        T, S, L: tl.constexpr, G: tl.constexpr, TP: tl.constexpr, BC: tl.constexpr,
                        NEG: tl.constexpr):
        """Program (i, t, c): tree row i of slot c, cache columns t*BC.. (the capacity S stays a runtime value, so
        a growing cache never recompiles the kernel); column tile 0 also writes the row's ids, pos, anc."""
        i = tl.program_id(0)
        first = tl.program_id(1) == 0
        slot = tl.program_id(2).to(tl.int64)
        bonus_ptr += slot
        start_ptr += slot
        tok_ptr += slot * (T - 1)
        par_ptr += slot * (T - 1)
        dep_ptr += slot * (T - 1)
        ids_ptr += slot * T
        pos_ptr += slot * T
        path_ptr += slot * T * (L + 1)
        anc_ptr += slot * T * T
        bias_ptr += slot * G * T * S
        start = tl.load(start_ptr)
        di = tl.load(dep_ptr + i - 1, mask=i > 0, other=0)
        cur = i
        for _ in range(L + 1):  # depth <= L: the walk reaches the root and stays there
            dc = tl.load(dep_ptr + cur - 1, mask=cur > 0, other=0)
            tl.store(path_ptr + i * (L + 1) + dc, cur.to(tl.int64))  # every tile of row i writes the same values
            cur = tl.load(par_ptr + cur - 1, mask=cur > 0, other=0).to(tl.int32)
        tl.debug_barrier()
        if first:
            tok = tl.load(tok_ptr + i - 1, mask=i > 0, other=0)
            tl.store(ids_ptr + i, tl.where(i > 0, tok, tl.load(bonus_ptr)))
            tl.store(pos_ptr + i, start + di)
            j = tl.arange(0, TP)
            mj = j < T
            dj = _depth_of(dep_ptr, j, mj)
            on = mj & (dj <= di)
            pj = tl.load(path_ptr + i * (L + 1) + dj, mask=on, other=-1)
            tl.store(anc_ptr + i * T + j, (on & (pj == j)).to(tl.int8), mask=mj)
        c = tl.program_id(1) * BC + tl.arange(0, BC)
        mc = c < S
        rel = c - start
        inside = mc & (rel >= 0) & (rel < T)
        dr = _depth_of(dep_ptr, rel, inside)
        onr = inside & (dr <= di)
        pr = tl.load(path_ptr + i * (L + 1) + dr, mask=onr, other=-1)
        vis = (c < start) | (onr & (pr == rel))
        val = tl.where(vis, 0.0, NEG).to(bias_ptr.dtype.element_ty)
        for g in range(G):
            tl.store(bias_ptr + (g * T + i) * S + c, val, mask=mc)

    @triton.jit
    def _walk_kernel(ids_ptr, par_ptr, dep_ptr, path_ptr, post_ptr, out_ptr, stage_ptr, T, L: tl.constexpr,
                     TP: tl.constexpr, LP: tl.constexpr, NODES: tl.constexpr, TOKENS: tl.constexpr, BONUS: tl.constexpr,
                     SIZE: tl.constexpr):
        """Program c: slot c's walk result at out[c] (SIZE long) in WalkLayout order (count at 0, nodes at NODES,
        tokens at TOKENS, bonus at BONUS); stage[c] ([T]) stages the per-row matches."""
        slot = tl.program_id(0).to(tl.int64)
        ids_ptr += slot * T
        par_ptr += slot * (T - 1)
        dep_ptr += slot * (T - 1)
        path_ptr += slot * T * (L + 1)
        post_ptr += slot * T
        out_ptr += slot * SIZE
        stage_ptr += slot * T
        j = tl.arange(0, TP)
        mj = j < T
        ids = tl.load(ids_ptr + j, mask=mj, other=0)
        pj = tl.load(par_ptr + j - 1, mask=mj & (j > 0), other=0)
        dj = _depth_of(dep_ptr, j, mj)
        match = (ids == tl.load(post_ptr + pj, mask=mj, other=-1)) | (j == 0)
        # stage the matches so each row can read them along its path
        tl.store(stage_ptr + j, match.to(tl.int64), mask=mj)
        d = tl.arange(0, LP)
        md = d < L + 1
        tl.store(out_ptr + NODES + d, tl.zeros([LP], tl.int64), mask=md)
        tl.debug_barrier()
        ok = mj
        deepest = tl.max(tl.where(mj, dj, 0), axis=0)   # depths past the tree's deepest node check nothing
        for s in range(0, deepest + 1):
            on = mj & (s <= dj)
            node = tl.load(path_ptr + j * (L + 1) + s, mask=on, other=0)
            ok = ok & (~on | (tl.load(stage_ptr + node, mask=on, other=0) != 0))
        a = tl.sum(ok.to(tl.int64), axis=0)
        tl.store(out_ptr, a)
        tl.store(out_ptr + NODES + dj, j.to(tl.int64), mask=ok)
        tl.debug_barrier()
        idx = tl.load(out_ptr + NODES + d, mask=md, other=0)
        tl.store(out_ptr + TOKENS + d, tl.load(ids_ptr + idx, mask=md, other=0), mask=md)
        last = tl.load(out_ptr + NODES + a - 1)
        tl.store(out_ptr + BONUS, tl.load(post_ptr + last))

    @triton.jit
    def _accepted(walked_ptr, live_ptr, FLAG, GUARD: tl.constexpr, LIVE: tl.constexpr):
        """(a, ok): accepted count and whether to commit - with GUARD, a raised certificate flag at
        walked[FLAG] makes ok false and a 0; with LIVE, a = 0 where live is 0 (a padding slot: nothing moves)."""
        a = tl.load(walked_ptr)
        ok = a >= 0
        if GUARD:
            ok = tl.load(walked_ptr + FLAG) == 0
            a = tl.where(ok, a, 0)
        if LIVE:
            a = a * tl.load(live_ptr)
        return a, ok

    @triton.jit
    def _commit_rows_kernel(k_ptr, v_ptr, hidden_ptr, ctx_ptr, walked_ptr, start_ptr, live_ptr, S, HKV, NLH, T, CW,
                            hstride, s_layer, s_slot, s_ctx, s_walk, FLAG, L: tl.constexpr, LP: tl.constexpr,
                            D: tl.constexpr, DP: tl.constexpr, BCW: tl.constexpr, GUARD: tl.constexpr,
                            LIVE: tl.constexpr, NODES: tl.constexpr):
        """Program (p, c), slot c: p < NLH - one (layer, KV head) each - moves the kept K/V rows down in slot c's
        region (all loads before any store: sources and destinations overlap). The rest: one block of BCW
        context columns each, gathers slot c's kept hidden rows (rows c*T..) into ctx[c]. A raised flag
        (GUARD) moves nothing, writes no ctx."""
        pid = tl.program_id(0)
        slot = tl.program_id(1).to(tl.int64)
        walked_ptr += slot * s_walk
        start_ptr += slot
        live_ptr += slot
        i = tl.arange(0, LP)
        mi = i < L + 1
        a, ok = _accepted(walked_ptr, live_ptr, FLAG, GUARD, LIVE)
        idx = tl.load(walked_ptr + NODES + i, mask=mi, other=0)
        src = tl.where(i < a, idx, i)
        if pid < NLH:
            start = tl.load(start_ptr)
            dd = tl.arange(0, DP)
            mkv = mi[:, None] & (dd < D)[None, :]   # (names differ per branch: Triton unifies same-named values)
            base = (pid // HKV).to(tl.int64) * s_layer + slot * s_slot + (pid % HKV).to(tl.int64) * S * D
            so = base + (start + src)[:, None] * D + dd[None, :]
            kk = tl.load(k_ptr + so, mask=mkv)
            vv = tl.load(v_ptr + so, mask=mkv)
            tl.debug_barrier()
            do = base + (start + i)[:, None] * D + dd[None, :]
            tl.store(k_ptr + do, kk, mask=mkv)
            tl.store(v_ptr + do, vv, mask=mkv)
        else:
            c = (pid - NLH) * BCW + tl.arange(0, BCW)
            mctx = (mi[:, None] & (c < CW)[None, :] & ok) != 0   # (!= 0: the interpreter widens the bools to int32)
            rows = slot * T + tl.minimum(src, T - 1).to(tl.int64)
            h = tl.load(hidden_ptr + rows[:, None] * hstride + c[None, :], mask=mctx)
            tl.store(ctx_ptr + slot * s_ctx + i[:, None] * CW + c[None, :], h, mask=mctx)

    @triton.jit
    def _commit_state_kernel(walked_ptr, start_ptr, ctx_start_ptr, bonus_ptr, live_ptr, s_walk, FLAG,
                             BONUS: tl.constexpr, GUARD: tl.constexpr, LIVE: tl.constexpr):
        """Program c, after the rows (stream order): slot c's ctx_start = start, bonus, start += a - unless the flag
        is raised."""
        slot = tl.program_id(0).to(tl.int64)
        walked_ptr += slot * s_walk
        live_ptr += slot
        a, ok = _accepted(walked_ptr, live_ptr, FLAG, GUARD, LIVE)
        start = tl.load(start_ptr + slot)
        tl.store(ctx_start_ptr + slot, start, mask=ok)
        tl.store(bonus_ptr + slot, tl.load(walked_ptr + BONUS), mask=ok)
        tl.store(start_ptr + slot, start + a)


def compile_tree(bonus: torch.Tensor, tok: torch.Tensor, par: torch.Tensor, dep: torch.Tensor, start: torch.Tensor,
                 capacity: int, dtype: torch.dtype, group: int, L: int):
    """bonus [1], tok/par/dep [N] (parents 1-based), start 0-d -> ids [T], pos [T], anc [T, T] bool,
    bias [group*T, capacity] in dtype, path [T, L+1] (T = 1 + N): the loop's tree-compile outputs (gpu/loop.Compiled)."""
    ids, pos, anc, bias, path = compile_trees(bonus, tok[None], par[None], dep[None], start.reshape(1), capacity, dtype,
                                              group, L)
    return ids, pos, anc[0], bias[0], path[0]


def compile_trees(bonus: torch.Tensor, tok: torch.Tensor, par: torch.Tensor, dep: torch.Tensor, start: torch.Tensor,
                  capacity: int, dtype: torch.dtype, group: int, L: int):
    """C trees at once: bonus [C], tok/par/dep [C, N], start [C] -> ids [C*T], pos [C*T] (slot c's rows at c*T..),
    anc [C, T, T] bool, bias [C, group*T, capacity], path [C, T, L+1]: compile_tree per slot, one launch."""
    C, N = tok.shape
    T = 1 + N
    dev = tok.device
    ids = torch.empty(C * T, dtype=torch.long, device=dev)
    pos = torch.empty(C * T, dtype=torch.long, device=dev)
    path = torch.empty(C, T, L + 1, dtype=torch.long, device=dev)  # row i: only depths <= depth(i) are written and read
    anc = torch.empty(C, T, T, dtype=torch.bool, device=dev)
    bias = torch.empty(C, group * T, capacity, dtype=dtype, device=dev)
    launch(_compile_kernel, (T, triton.cdiv(capacity, BC), C), bonus, tok.contiguous(), par.contiguous(), dep.contiguous(),
           start, ids, pos, path, anc.view(torch.int8), bias, T, capacity, L=L, G=group, TP=_pow2(T), BC=BC,
           NEG=float("-inf"))
    return ids, pos, anc, bias, path


def walk_tree(ids: torch.Tensor, par: torch.Tensor, dep: torch.Tensor, path: torch.Tensor, post: torch.Tensor,
              layout: WalkLayout) -> torch.Tensor:
    """walk_static's result (layout.size long, interface.WalkLayout) from compile_tree's path;
    post [T] = the target's pick at every row."""
    return walk_trees(ids, par[None], dep[None], path[None], post[None], layout)[0]


def walk_trees(ids: torch.Tensor, par: torch.Tensor, dep: torch.Tensor, path: torch.Tensor, post: torch.Tensor,
               layout: WalkLayout) -> torch.Tensor:
    """C walks at once: ids [C*T], par/dep [C, N], path [C, T, L+1], post [C, T] -> [C, layout.size], row c =
    walk_tree of slot c."""
    C, T = post.shape
    L, n = layout.L, layout.size
    out = torch.empty(C, n, dtype=torch.long, device=ids.device)
    stage = torch.empty(C, T, dtype=torch.long, device=ids.device)   # the per-row matches
    launch(_walk_kernel, (C,), ids, par.contiguous(), dep.contiguous(), path, post.contiguous(), out, stage, T, L=L,
           TP=_pow2(T), LP=_pow2(L + 1), NODES=layout.nodes, TOKENS=layout.tokens, BONUS=layout.bonus, SIZE=n)
    return out


def commit_tree(walked: torch.Tensor, layout: WalkLayout, start: torch.Tensor, ctx_start: torch.Tensor,
                bonus: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hidden: torch.Tensor, ctx: torch.Tensor) -> None:
    """tree_ops.commit_static in two launches (the rows, then the frontier state); same arguments (k, v
    [layers, Hkv, S, D]: a slot's region of a slotted cache too, each layer's [Hkv, S, D] contiguous)."""
    commit_trees(walked[None], layout, start.reshape(1), ctx_start.reshape(1), bonus.reshape(1), k[:, None], v[:, None],
                 hidden, ctx[None])


def commit_trees(walked: torch.Tensor, layout: WalkLayout, start: torch.Tensor, ctx_start: torch.Tensor,
                 bonus: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hidden: torch.Tensor, ctx: torch.Tensor,
                 live: torch.Tensor | None = None) -> None:
    """C commits at once: walked [C, size(+flag)], start / ctx_start / bonus [C], k / v [layers, B >= C, Hkv, S, D]
    (slot c's region k[:, c]), hidden [C*T, CW] (slot c's rows at c*T..), ctx [B >= C, L+1, CW]; live [C]
    (optional): a slot with live 0 commits a = 0 (its K/V stay; the batched loop's padding slots).
    = tree_ops.commit_static per slot c on walked[c] (a times live[c]) and slot c's views."""
    C = walked.shape[0]
    layers, _, hkv, S, D = k.shape
    CW = hidden.shape[1]
    T = hidden.shape[0] // C
    assert k.stride() == v.stride() and k.stride(2) == S * D and k.stride(3) == D and k.stride(4) == 1
    assert ctx.stride(1) == CW and ctx.stride(2) == 1 and hidden.stride(1) == 1 and walked.stride(1) == 1
    BCW = 1024
    grid = (layers * hkv + triton.cdiv(CW, BCW), C)
    L, guard, flag = layout.L, layout.guard, layout.flag
    has_live = live is not None
    lv = live if has_live else walked   # (an unread pointer without LIVE)
    launch(_commit_rows_kernel, grid, k, v, hidden, ctx, walked, start, lv, S, hkv, layers * hkv, T, CW, hidden.stride(0),
           k.stride(0), k.stride(1) if C > 1 else 0, ctx.stride(0) if C > 1 else 0, walked.stride(0) if C > 1 else 0, flag,
           L=L, LP=_pow2(L + 1), D=D, DP=_pow2(D), BCW=BCW, GUARD=guard, LIVE=has_live, NODES=layout.nodes)
    launch(_commit_state_kernel, (C,), walked, start, ctx_start, bonus, lv, walked.stride(0) if C > 1 else 0, flag,
           BONUS=layout.bonus, GUARD=guard, LIVE=has_live)
