"""Probe: can a Gluon kernel (Triton's lower-level language: explicit wgmma, TMA, mbarriers) run the tree verify's
prefix attention faster than the engine's Triton kernel on Hopper?

Item 2 of issue 35 needs the tree attention 1.6-3x faster at n = 128-512 (docs/gpu-performance.md, Known gaps), the
softmax / tensor-core overlap of FlashAttention-3 (arXiv 2407.08608) that Triton 3.6's own pipeliner does not give
this loop (it waits on each q k^T right after issuing it). Gluon, shipped inside Triton since 3.4
(`triton.experimental.gluon`), lets the kernel say where each asynchronous wgmma is waited for. This script times,
on the Qwen3-8B attention shape (32 query heads over 8 KV heads, head dim 128, bf16), the dense prefix phase alone
- every folded query row (t-major: row = t * G + head in the group, as kernels/tree_attention.py folds them) against
slots [0, prefix) of its KV head, no mask but the tail tile's - four ways:
* `triton`: the engine's own prefix step (`tree_attention._prefix_step`) in a loop, at the engine's launch shapes
  for that row count (64 x 64 keys, two stages; 64 x 32 in three, the H100 / H200's narrow tiles);
* `gluon-sync`: a Gluon kernel with TMA loads of K / V into a ring of STAGES tiles, q k^T and P V on wgmma, each
  waited for at once (FlashAttention-2's order, with Hopper's instructions);
* `gluon-overlap`: the same with FlashAttention-3's intra-warpgroup order: tile j's q k^T and tile j-1's P V issued
  together, the softmax of tile j run while P V is on the tensor cores;
* `sdpa`: PyTorch's SDPA over the unfolded heads, for scale.
With `--mode tree` it times the whole tree verify attention instead: the engine's `tree_attend` at the card's default
launch (split ranges and combine included) against `gluon-tree`, the overlap kernel carried on over the tree's
64-slot tiles masked by vis_words (one range, no combine). Each result is checked against an fp32 SDPA over the same
rows (with the tree's mask in tree mode) before it is timed; the times are CUDA-graph replays
(median of `--rounds` replays of a graph of `--replays` calls, divided by them) and TFLOP/s counts 4 Hq D n
prefix. A probe, not a path of the engine: nothing here is called by the product.
    PYTHONPATH=. python benchmarks/gpu_gluon_prefix_probe.py --tokens 64,128,256,512,1024 --prefix 1024 [--mode tree]
Needs a Hopper GPU and a Triton with Gluon's Hopper module (3.6 has it); prints what it cannot run and goes on.
"""

from __future__ import annotations

import argparse
import sys

import torch

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ddtree_bench.engine.gpu.graphs import replay_ms
from ddtree_bench.engine.gpu.kernels.tree_attention import _prefix_step

# Gluon's TMA load is `async_copy_global_to_shared` in Triton 3.6 (the device's) and `async_load` from 3.7 on, where the
# old name raises: the probe takes whichever this Triton has
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

LOG2E = 1.4426950408889634


@gluon.jit
def _gluon_attn_kernel(Q, O, WORDS, k_desc, v_desc, PREFIX, M, T, S, W, sqh, sot, qk_scale,
                       G: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                       STAGES: gl.constexpr, PRELOAD: gl.constexpr, OVERLAP: gl.constexpr, TREE: gl.constexpr,
                       num_warps: gl.constexpr):
    """One program: BLOCK_M folded rows of KV head program_id(0) against its prefix slots and, TREE, the tree's
    64-slot tiles up to the block's last node, a row seeing a tree slot iff its bit is set in vis_words (BLOCK_N ==
    64: one word a row and tile; WORDS is None without TREE). OVERLAP: FlashAttention-3's order (TREE needs it); else
    each wgmma waited at once. One range; O normalised."""
    h = gl.program_id(0)
    pid_m = gl.program_id(1)
    prefix = gl.load(PREFIX).to(gl.int32)
    dtype: gl.constexpr = Q.dtype.element_ty
    gl.static_assert(OVERLAP or not TREE, "the tree kernel runs in the overlap order only")

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    ld_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                               warps_per_cta=[num_warps, 1], order=[1, 0])
    q_smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    # Q: the block's folded rows, gathered once (t-major) and kept in shared memory for every q k^T
    rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ld_layout))
    dims = gl.arange(0, D, layout=gl.SliceLayout(0, ld_layout))
    rmask = rows < M
    t = gl.where(rmask, rows // G, 0)
    qh = h * G + rows % G
    q = gl.load(Q + qh[:, None] * sqh + t[:, None] * D + dims[None, :], mask=rmask[:, None], other=0.0)
    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], q_smem_layout, q)

    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], v_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()

    n_pre = gl.cdiv(prefix, BLOCK_N)
    if TREE:
        t_last = gl.minimum((pid_m * BLOCK_M + BLOCK_M - 1) // G, T - 1)
        n_tiles = n_pre + t_last // BLOCK_N + 1
        tree_shift = prefix - n_pre * BLOCK_N   # a tree tile i >= n_pre starts at slot prefix + (i - n_pre) * BLOCK_N
    else:
        n_tiles = n_pre
    row0 = h * S
    nbytes: gl.constexpr = 2 * BLOCK_N * D * 2
    for i in gl.static_range(PRELOAD):   # overlap: every slot (tile 0's frees only after tile 1's q k^T)
        ok = i < n_tiles
        c = row0 + i * BLOCK_N
        if TREE:
            c += (i >= n_pre).to(gl.int32) * tree_shift
        mbarrier.expect(bars.index(i), nbytes, pred=ok)
        _tma_load(k_desc, [c, 0], bars.index(i), k_smem.index(i), pred=ok)
        _tma_load(v_desc, [c, 0], bars.index(i), v_smem.index(i), pred=ok)

    if TREE:   # each row's visibility words, one int64 a 64-slot tree tile
        srows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        smask = srows < M
        wrow = WORDS + gl.where(smask, srows // G, 0) * W
    m_i = gl.full([BLOCK_M], -1.0e30, gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_M, D], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    cols0 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))

    if OVERLAP:
        # tile 0 alone (a prefix tile: prefix >= 1): its scores, then the loop issues tile j's q k^T beside tile
        # j-1's P V
        mbarrier.wait(bars.index(0), 0)
        s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s_tok, ))
        s = gl.where((cols0 < prefix)[None, :], s * qk_scale, float("-inf"))
        m_i = gl.maximum(m_i, gl.max(s, axis=1))
        p = gl.exp2(s - m_i[:, None])
        l_i = gl.sum(p, axis=1)
        p_prev = gl.convert_layout(p.to(dtype), p_layout)
        for j in range(1, n_tiles):
            slot = j % STAGES
            prev = (j - 1) % STAGES
            mbarrier.wait(bars.index(slot), (j // STAGES) & 1)
            s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            acc_tok = warpgroup_mma(p_prev, v_smem.index(prev), acc, is_async=True)
            if TREE:
                tree = j >= n_pre
                w = gl.load(wrow + (j - n_pre), mask=smask & tree, other=0)
                seen = ((w[:, None] >> cols0[None, :].to(gl.int64)) & 1) != 0
                seen = gl.where(tree, seen, ((j * BLOCK_N + cols0) < prefix)[None, :])
                s = warpgroup_mma_wait(1, deps=(s_tok, ))
            else:
                s = warpgroup_mma_wait(1, deps=(s_tok, ))
                seen = ((j * BLOCK_N + cols0) < prefix)[None, :]
            s = gl.where(seen, s * qk_scale, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + gl.sum(p, axis=1)
            m_i = m_new
            p_prev = gl.convert_layout(p.to(dtype), p_layout)
            acc = warpgroup_mma_wait(0, deps=(acc_tok, ))
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            # tile j-1's slot is free now that its P V is done: the tile STAGES - 1 ahead goes there
            nxt = j + STAGES - 1
            ok = nxt < n_tiles
            c = row0 + nxt * BLOCK_N
            if TREE:
                c += (nxt >= n_pre).to(gl.int32) * tree_shift
            mbarrier.expect(bars.index(prev), nbytes, pred=ok)
            _tma_load(k_desc, [c, 0], bars.index(prev), k_smem.index(prev), pred=ok)
            _tma_load(v_desc, [c, 0], bars.index(prev), v_smem.index(prev), pred=ok)
        last = (n_tiles - 1) % STAGES
        acc_tok = warpgroup_mma(p_prev, v_smem.index(last), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc_tok, ))
    else:
        for j in range(0, n_tiles):
            nxt = j + STAGES - 1
            ok = nxt < n_tiles
            ns = nxt % STAGES
            mbarrier.expect(bars.index(ns), nbytes, pred=ok)
            _tma_load(k_desc, [row0 + nxt * BLOCK_N, 0], bars.index(ns), k_smem.index(ns), pred=ok)
            _tma_load(v_desc, [row0 + nxt * BLOCK_N, 0], bars.index(ns), v_smem.index(ns), pred=ok)
            slot = j % STAGES
            mbarrier.wait(bars.index(slot), (j // STAGES) & 1)
            s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(0, deps=(s_tok, ))
            cols = j * BLOCK_N + cols0
            s = gl.where((cols < prefix)[None, :], s * qk_scale, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + gl.sum(p, axis=1)
            m_i = m_new
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            acc_tok = warpgroup_mma(gl.convert_layout(p.to(dtype), p_layout), v_smem.index(slot), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=(acc_tok, ))

    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))
    out = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
    orows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
    odims = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    omask = orows < M
    ot = gl.where(omask, orows // G, 0)
    oh = h * G + orows % G
    gl.store(O + ot[:, None] * sot + oh[:, None] * D + odims[None, :], out.to(dtype), mask=omask[:, None])


@triton.jit
def _triton_prefix_kernel(Q, K, V, PREFIX, O, M, sqh, skh, skn, svh, svn, sot, qk_scale,
                          G: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The engine's prefix phase alone (tree_attention._prefix_step over [0, prefix)), one range, O normalised."""
    h = tl.program_id(0)
    pid_m = tl.program_id(1)
    prefix = tl.load(PREFIX).to(tl.int32)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    t = tl.where(rmask, rows // G, 0)
    qh = h * G + rows % G
    dims = tl.arange(0, D)
    q = tl.load(Q + qh[:, None] * sqh + t[:, None] * D + dims[None, :], mask=rmask[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    full = prefix // BLOCK_N * BLOCK_N
    for n0 in range(0, full, BLOCK_N):
        acc, m_i, l_i = _prefix_step(q, acc, m_i, l_i, K, V, h * skh, h * svh, n0 + tl.arange(0, BLOCK_N), skn, svn,
                                     dims, qk_scale, False, prefix, False, False)
    if full < prefix:
        acc, m_i, l_i = _prefix_step(q, acc, m_i, l_i, K, V, h * skh, h * svh, full + tl.arange(0, BLOCK_N), skn, svn,
                                     dims, qk_scale, True, prefix, False, False)
    out = acc / l_i[:, None]
    tl.store(O + t[:, None] * sot + qh[:, None] * D + dims[None, :], out.to(O.dtype.element_ty), mask=rmask[:, None])


def _gluon_attend(q, k, v, prefix, words, block_m, block_n, stages, overlap):
    """One launch of `_gluon_attn_kernel`: TMA descriptors over k / v, the output, the grid (words None: no tree)."""
    Hq, T, D = q.shape
    Hkv, S, _ = k.shape
    G = Hq // Hkv
    layout = gl.NVMMASharedLayout.get_default_for([block_n, D], gl.bfloat16)
    k_desc = TensorDescriptor(k, [Hkv * S, D], [D, 1], [block_n, D], layout)
    v_desc = TensorDescriptor(v, [Hkv * S, D], [D, 1], [block_n, D], layout)
    out = torch.empty(T, Hq * D, dtype=q.dtype, device=q.device)
    tree = words is not None
    grid = (Hkv, triton.cdiv(G * T, block_m))
    _gluon_attn_kernel[grid](q, out, words, k_desc, v_desc, prefix, G * T, T, S, words.shape[-1] if tree else 0,
                             q.stride(0), Hq * D, D ** -0.5 * LOG2E, G=G, D=D, BLOCK_M=block_m, BLOCK_N=block_n,
                             STAGES=stages, PRELOAD=stages if overlap else stages - 1, OVERLAP=overlap, TREE=tree,
                             num_warps=block_m // 16)
    return out


def gluon_prefix(q, k, v, prefix, block_m=64, block_n=128, stages=2, overlap=True):
    """q [Hq, T, D], k / v [Hkv, S, D] contiguous, prefix 0-d long -> [T, Hq*D]."""
    return _gluon_attend(q, k, v, prefix, None, block_m, block_n, stages, overlap)


def gluon_tree(q, k, v, words, prefix, block_m=64, stages=3):
    """The tree verify's whole attention: q [Hq, T, D], k / v [Hkv, S, D] contiguous (the tree's K / V at slots
    prefix + 0..T-1), words vis_words' [1, T, W], prefix 0-d long -> [T, Hq*D]."""
    return _gluon_attend(q, k, v, prefix, words, block_m, 64, stages, True)


def random_tree(n: int, L: int = 15, device="cpu", seed: int = 0):
    """A tree of n nodes in DDTree's order (a parent before its children, depth <= L): path [n, L+1] (row t: its
    ancestors by depth, itself at depth(t); -1 past it) and depths [n]. Each node's parent is drawn among the nodes
    before it that are shallower than L, the first few times from the deepest chain (DDTree's trees hold one long
    likely path and wide shallow levels)."""
    g = torch.Generator().manual_seed(seed)
    depth = [0]
    path = [[0] + [-1] * L]
    for i in range(1, n):
        open_ = [j for j in range(i) if depth[j] < L]
        par = open_[-1] if i <= L else open_[int(torch.randint(len(open_), (1,), generator=g))]
        depth.append(depth[par] + 1)
        row = list(path[par])
        row[depth[i]] = i
        path.append(row)
    return torch.tensor(path, device=device), torch.tensor(depth, device=device)


def reference_tree(q, k, v, path, depth, prefix: int):
    """fp32 SDPA over the prefix and each row's ancestors-or-self: the tree verify's attention."""
    Hq, T, D = q.shape
    G = Hq // k.shape[0]
    seen = torch.zeros(T, prefix + T, dtype=torch.bool, device=q.device)
    seen[:, :prefix] = True
    for t in range(T):
        seen[t, prefix + path[t, :int(depth[t]) + 1]] = True
    kk = k[:, :prefix + T].float().repeat_interleave(G, 0)
    vv = v[:, :prefix + T].float().repeat_interleave(G, 0)
    o = torch.nn.functional.scaled_dot_product_attention(q.float(), kk, vv, attn_mask=seen)
    return o.transpose(0, 1).reshape(T, Hq * D)


def triton_prefix(q, k, v, prefix, block_m=64, block_n=64, stages=2):
    Hq, T, D = q.shape
    Hkv = k.shape[0]
    G = Hq // Hkv
    M = G * T
    out = torch.empty(T, Hq * D, dtype=q.dtype, device=q.device)
    grid = (Hkv, triton.cdiv(M, block_m))
    _triton_prefix_kernel[grid](q, k, v, prefix, out, M, q.stride(0), k.stride(0), k.stride(1), v.stride(0),
                                v.stride(1), Hq * D, D ** -0.5 * LOG2E, G=G, D=D, BLOCK_M=block_m, BLOCK_N=block_n,
                                num_warps=4, num_stages=stages)
    return out


def compile_sm90(block_m: int, block_n: int, stages: int, overlap: bool, G: int = 4, D: int = 128,
                 tree: bool = False) -> str:
    """A Gluon kernel compiled for sm_90 (H100 / H200) with no GPU, as a launch of gluon_prefix (or, `tree`,
    gluon_tree, which is always the overlap order over 64-wide tiles) would build it: its PTX (the CPU test reads
    where the wgmma waits sit)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    layout = gl.NVMMASharedLayout.get_default_for([block_n, D], gl.bfloat16)
    desc = f"tensordesc<bf16[{block_n}, {D}],{layout!r}>"
    sig = {"Q": "*bf16", "O": "*bf16", "WORDS": "*i64" if tree else "constexpr", "k_desc": desc, "v_desc": desc,
           "PREFIX": "*i64", "M": "i32", "T": "i32", "S": "i32", "W": "i32", "sqh": "i32", "sot": "i32",
           "qk_scale": "fp32"}
    consts = {"G": G, "D": D, "BLOCK_M": block_m, "BLOCK_N": block_n, "STAGES": stages,
              "PRELOAD": stages if overlap or tree else stages - 1, "OVERLAP": overlap or tree, "TREE": tree,
              "num_warps": block_m // 16}
    if not tree:
        consts["WORDS"] = None
    sig.update({name: "constexpr" for name in consts})
    src = GluonASTSource(_gluon_attn_kernel, sig, constexprs=consts)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": block_m // 16}).asm["ptx"]


def reference(q, k, v, prefix: int):
    Hq, T, D = q.shape
    G = Hq // k.shape[0]
    kk = k[:, :prefix].float().repeat_interleave(G, 0)
    vv = v[:, :prefix].float().repeat_interleave(G, 0)
    o = torch.nn.functional.scaled_dot_product_attention(q.float(), kk, vv)
    return o.transpose(0, 1).reshape(T, Hq * D)


def timed_ms(fn, replays: int, rounds: int) -> float:
    """ms a call: graphs.replay_ms (median of `rounds` replays) over a graph of `replays` calls, so the graph's own
    launch is spread over them (a call here is 4-60 us)."""
    return replay_ms(lambda: [fn() for _ in range(replays)], reps=rounds) / replays


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="64,128,256,512,1024")
    ap.add_argument("--prefix", default="1024")
    ap.add_argument("--mode", choices=("prefix", "tree"), default="prefix",
                    help="prefix: the dense prefix phase alone (--arms); tree: the whole tree verify attention, the "
                         "engine's tree_attend (its default launch for the card, combine included) against the Gluon "
                         "tree kernel (--tree-arms)")
    ap.add_argument("--tree-arms", default="engine:0x0s0,gluon-tree:64x64s3,gluon-tree:64x64s4,gluon-tree:128x64s3")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--arms", default="sdpa:0x0s0,triton:64x64s2,triton:64x32s3,gluon-sync:64x128s2,gluon-sync:64x64s3,"
                    "gluon-overlap:64x64s3,gluon-overlap:64x64s4,gluon-overlap:64x128s3,gluon-overlap:128x128s3,"
                    "gluon-overlap:128x64s4")
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    dev = torch.device("cuda")
    Hq, Hkv, D = 32, 8, 128
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print(f"# mode {a.mode}: TFLOP/s counts the prefix's 4 Hq D n prefix only")
    print("| n | prefix | arm | ms | TFLOP/s | max err vs fp32 |")
    print("|---|---|---|---|---|---|")
    for prefix in [int(x) for x in a.prefix.split(",")]:
        for n in [int(x) for x in a.tokens.split(",")]:
            S = prefix + n
            q = torch.randn(Hq, n, D, device=dev, dtype=torch.bfloat16)
            k = torch.randn(Hkv, S, D, device=dev, dtype=torch.bfloat16)
            v = torch.randn(Hkv, S, D, device=dev, dtype=torch.bfloat16)
            pre = torch.tensor(prefix, device=dev)
            flop = 4 * Hq * D * n * prefix
            if a.mode == "tree":
                from ddtree_bench.engine.gpu.kernels.tree_attention import tree_attend, vis_words
                path, depth = random_tree(n, device=dev)
                pos = pre + depth
                words = vis_words(path, pos, pre)
                ref = reference_tree(q, k, v, path, depth, prefix)
                arms = a.tree_arms.split(",")
            else:
                ref = reference(q, k, v, prefix)
                arms = a.arms.split(",")
            for arm in arms:
                kind, shape = arm.split(":")
                bm, rest = shape.split("x")
                bn, st = rest.split("s")
                bm, bn, st = int(bm), int(bn), int(st)
                if kind == "sdpa":   # PyTorch's own (flash / cuDNN) kernel over the unfolded heads, for scale
                    kp, vp = k[None, :, :prefix], v[None, :, :prefix]
                    fn = lambda: torch.nn.functional.scaled_dot_product_attention(   # noqa: E731
                        q[None], kp, vp, enable_gqa=True)
                elif kind == "engine":
                    fn = lambda: tree_attend(q, k, v, path, pos, pre, words=words)   # noqa: E731
                elif kind == "gluon-tree":
                    fn = lambda: gluon_tree(q, k, v, words, pre, bm, st)   # noqa: E731
                elif kind == "triton":
                    fn = lambda: triton_prefix(q, k, v, pre, bm, bn, st)   # noqa: E731
                else:
                    fn = lambda: gluon_prefix(q, k, v, pre, bm, bn, st, kind == "gluon-overlap")   # noqa: E731
                try:
                    got = fn()
                    if kind == "sdpa":
                        got = got[0].transpose(0, 1).reshape(n, Hq * D)
                    err = (got.float() - ref).abs().max().item()
                    ms = timed_ms(fn, a.replays, a.rounds)
                except Exception as e:   # a probe: one arm failing to compile or run must not hide the others
                    print(f"| {n} | {prefix} | {arm} | failed: {type(e).__name__}: {str(e).splitlines()[0][:160]} | | |")
                    continue
                print(f"| {n} | {prefix} | {arm} | {ms:.4f} | {flop / ms / 1e9:.0f} | {err:.2e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
