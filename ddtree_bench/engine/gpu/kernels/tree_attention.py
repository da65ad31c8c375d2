"""The target's verify attention as one Triton kernel: dense over the committed prefix, gathered over the tree.

In a DDTree verify, tree row t (query tokens at slots prefix + 0..T-1, root first) sees every slot
of the committed prefix and, in the tree part, exactly its ancestors and itself: the nodes
path[t, 0..depth(t)] (`path` [T, L+1] from kernels/tree_verify.compile_tree, depth(t) = pos[t] - prefix
<= L). `tree_attend(q, k, v, path, pos, prefix)` computes
    out = softmax(q k^T / sqrt(D) + bias) v
over those slots, the same as forward.grouped_attend (SDPA over every cache slot with compile_tree's
bias, its PyTorch twin) and kernels/attention.live_attend, but:
* the prefix phase reads slots [0, prefix) with no bias and no mask (every row sees them): a
  flash-attention loop over full BLOCK_N tiles, one masked tail tile;
* the tree phase reads only the <= L+1 ancestor slots of each row, gathered through `path`, so its
  work is T * (L+1) per head instead of the T * T / 2 of a masked triangle (live_attend) or the
  T * capacity of SDPA over the whole cache; or, with `Config.tree_dense`, it loops over the tree's
  key tiles (slots prefix + 0..T-1) with tensor-core dots like the prefix phase and masks each tile by
  visibility from the path table (node j is visible to row t iff depth(j) <= depth(t) and
  path[t, depth(j)] == j) or, given `words` (vis_words: each row's ancestors-or-self as bits, made once per
  forward by TreeRows, which forward.py passes), from one or two words per row and tile instead of a
  BLOCK_M x BLOCK_N gather of path entries: the gather's depth steps run one after another, each a per-row dot product,
  while a dense tile serves up to BLOCK_N depths at once. A node's ancestors come before it in the
  tree's order (parent index < child index: tests/engine/gpu/test_attention_triton.py checks it on
  built trees), so a row block stops at its last row's node: ~T / 2 tree slots per block on average,
  less the tiles that hold none of the block's ancestors (skipped, read off the block's path rows);
* the g query heads of a KV head are folded t-major (row r = t*g + query head), so the rows of one
  tree node sit side by side and share their gathered K/V rows (L1 hits);
* few rows split the prefix into ranges (split-KV) and attention.py's combine kernel reduces them,
  as live_attend does (with `Config.fold` inside the same launch: attention.py's docstring); the tree
  phase is then one more range of its own, so it runs beside the prefix ranges instead of
  lengthening one of them, and it stops at its row block's deepest row (gather) or last node (dense).
Online softmax in fp32 (running max m, sum l, unnormalised acc); q k^T in fp32 (IEEE for fp32
inputs); probabilities cast to the value dtype before the P V product, as SDPA's fused kernels do.
The prefix length comes from a device tensor, so a captured graph stays valid as the prefix grows.
With a leading slot axis (C trees of equal width over C regions of a slotted cache: q [C, Hq, T, D], k, v
[C, Hkv, S, D], path [C, T, L+1], pos [C*T], prefix [C]; batch_forward.py) each program reads its slot's tree
and region only, as attention.py's slot axis does (same grid rule, runtime slot strides, the output [C*T, Hq*D]
slot-major); config's tuned prefix ranges are spread over the slots, ceil(ranges / C), small trees' 16 (`ranges_for`).
Block sizes depend only on the folded row count's bucket (`config`), so a new budget compiles at most
one new variant. Knows nothing of models or of how the tree was built.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ddtree_bench.engine.gpu.kernels.attention import NEG_BIG, available, combine, counters, n_split, partial_dtype
from ddtree_bench.engine.gpu.kernels.common import _pow2, is_tuned_hopper, tl, triton

if triton is not None:   # the shared @triton.jit helpers exist only with Triton; without it this module still imports
    from ddtree_bench.engine.gpu.kernels.attention import _last_of_block, _reduce_ranges, _slot_of
from ddtree_bench.engine.gpu.kernels import experimental, pdl, warm

LOG2E = 1.4426950408889634
RANGES_TO = 768   # config(): folded rows up to which the prefix is split in ranges (DDTREE_TREE_RANGES_TO in an A/B)
RANGES_FEW_FROM = 384   # config(): from here to RANGES_TO, RANGES_FEW ranges; below, RANGES
RANGES, RANGES_FEW = 4, 2   # prefix ranges below / from RANGES_FEW_FROM rows (DDTREE_TREE_RANGES sets all three)
RANGES_SMALL, RANGES_SMALL_BELOW = 8, 128   # prefix ranges below this many folded rows (one slot's small trees)
# small trees over C >= 2 slots spread this many ranges, ceil(16 / C) a slot: two slots keep one slot's eight (and its
# summation order), four take four; config's other bands spread their own count (ranges_for)
SLOT_RANGES_SMALL = 16
# forward.py's and batch_forward.py's auto choice takes this kernel for a tree verify from this many folded query rows
# (n >= 8 tree nodes at 4 query heads per KV head), one slot or many, and the live-slot kernel below: on an H200 it won
# from here for one slot and over 2 / 4 / 16 slots (docs/gpu-performance.md, "Midnight" and "Where it stands")
TREE_MIN_ROWS = 32


@dataclass(frozen=True)
class Config:
    """Launch shape of the kernel for a folded row count M."""

    block_m: int
    block_n: int
    warps: int
    stages: int
    k_rows: bool = False   # K tiles loaded as rows and transposed in registers (else a strided [D, BLOCK_N] view)
    tree_dense: bool = False   # tree phase over masked key tiles of block_n nodes (else each row's ancestors gathered)
    fold: bool = False     # split-KV ranges combined inside the launch (else attention.py's combine kernel after it)
    ranges: int | None = None   # prefix ranges (split-KV) per row block, at most one per block_n slots; None: n_split's
    slot_ranges: int | None = None   # the ranges a launch over 2+ slots spreads over them (None: `ranges`)
    maxnreg: int | None = None   # a cap on registers a thread (ptxas .maxnreg), so more programs fit an SM; None: none


# wide tiles the tuner times (benchmarks/gpu_attention_tune.py; config()'s first two bands are the 64x64 and 64x128
# ones with the dense tree phase and fixed ranges): >= 64 rows per warpgroup, the tile Hopper's wgmma takes (fewer
# rows compile to mma.sync: benchmarks/triton_ptx_check.py prints which each shape gets)
WIDE_SHAPES = (Config(64, 64, 4, 2), Config(128, 64, 8, 2), Config(64, 128, 4, 2))
WIDE_BLOCK_NS = (32, 64, 128)   # key tile widths DDTREE_TREE_WIDE_BLOCK_N may name (an A/B knob; power-of-two tiles)
NARROW_TILES = (32, 3)   # config(): key tile width and stages of the two lower bands on an H100 SXM / H200 or "narrow-tiles"


def config(M: int, dtype: torch.dtype, device: torch.device | str | None = None) -> Config:
    """The launch shape for M folded rows, from the H200 tuning table (docs/gpu-performance.md, "H200,
    2026-12-02": 8B shape, bf16, 1024-token prefix, 36 layers; the shape fastest on wide and deep trees together at
    n = 64 / 128 and 256 / 512 and 1024, each band's edge between two tuned sizes so that a budget's B + 1 nodes
    land with its n): 64-row tiles (wgmma) with the dense tree phase to 1536 rows, the prefix split in four ranges
    below RANGES_FEW_FROM rows and two from there to RANGES_TO (in one-process A/Bs on the H200, 2026-12-03: at n = 64
    two ranges were 2.4% slower on the forward, at n = 128 4.1% faster than four; eight lost at both; folding the
    combine into the launch lost 2-5%; four ranges above RANGES_TO were 0.5-3.6% slower at n = 256, 2026-12-02);
    above RANGES_TO one range over 64-wide key tiles, small enough for two programs per SM (128-wide tiles took an SM
    each: B = 256's 257 nodes made 17 row blocks x 8 KV heads = 136 programs on 132 SMs, a second wave; with 64-wide
    ones the forward at n = 257 was 6.7% faster, at n = 256 0.7%, H200 2026-12-03 afternoon);
    above 1536 rows dense too since the visibility words (the attention alone at n = 512 / 1024: 10-12% faster than the
    gathered tree phase on wide trees, 29-41% on deep ones, H200 2026-12-03; without words it lost on wide trees);
    fp32 (the tests' twin check) single-stage. On an H100 SXM or an H200 (`device`; kernels/common.is_tuned_hopper) the two lower
    bands take NARROW_TILES, 32-wide key tiles in three stages (172 registers and 64 KB of shared memory a program
    under ncu: two programs an SM, as the 64-wide ones, with a deeper prefetch), and the wide band two prefix ranges:
    there the forward 0.995-0.998x at n = 17-128 and 0.985-0.990x at 256-257 in one process, 1.01-1.02x at 512 with
    the top band's tiles narrowed too, which is why it keeps its own (docs/gpu-performance.md, "2026-12-06 07:27-08:31
    UTC" and "10:28-10:50 UTC"), and on the H200 as fast or faster at every n timed ("2026-12-06 23:09-23:42 UTC").
    The experimental "narrow-tiles" gives any card those shapes, "narrow-off" those two the table's; no
    device (the tuner's and the tests' table reads) is the table."""
    narrow = M <= 1536 and narrow_tiles(device)
    block_n, stages = NARROW_TILES if narrow else (64, 2)
    if M <= experimental.knob("TREE_RANGES_TO", RANGES_TO):
        small = M < RANGES_SMALL_BELOW
        ranges = RANGES_SMALL if small else RANGES if M < RANGES_FEW_FROM else RANGES_FEW
        c = Config(64, block_n, 4, stages, tree_dense=True, ranges=experimental.knob("TREE_RANGES", ranges),
                   slot_ranges=experimental.knob("TREE_SLOT_RANGES", SLOT_RANGES_SMALL) if small else None)
    elif M <= 1536:
        c = Config(64, experimental.knob("TREE_WIDE_BLOCK_N", block_n, WIDE_BLOCK_NS), 4, stages, tree_dense=True,
                   ranges=experimental.knob("TREE_WIDE_RANGES", 2 if narrow else 1))
    else:
        c = Config(64, 64, 4, 3, tree_dense=True, ranges=experimental.knob("TREE_BIG_RANGES", 0) or None)
    # every band's tile rows and width, warps, stages and register cap, for an A/B only (unset: the table above)
    c = replace(c, block_m=experimental.knob("TREE_BLOCK_M", c.block_m, (16, 32, 64, 128)),
                block_n=experimental.knob("TREE_BLOCK_N", c.block_n, WIDE_BLOCK_NS),
                warps=experimental.knob("TREE_WARPS", c.warps, (1, 2, 4, 8)),
                stages=experimental.knob("TREE_STAGES", c.stages, (1, 2, 3, 4)),
                maxnreg=experimental.knob("TREE_MAXNREG", 0, (128, 168, 192)) or None)
    if experimental.enabled("tree-fold"):
        c = replace(c, fold=True)
    return replace(c, stages=1) if dtype == torch.float32 else c


def narrow_tiles(device: torch.device | str | None) -> bool:
    """Whether config() gives `device` NARROW_TILES below its top band: an H100 SXM or an H200 unless "narrow-off",
    any card with "narrow-tiles"; no device, no (the table). Results record it (bench-engine's `tree_tiles`)."""
    if experimental.enabled("narrow-off"):
        return False
    return experimental.enabled("narrow-tiles") or (device is not None and is_tuned_hopper(device))


if triton is not None:

    @triton.jit
    def _prefix_step(q, acc, m_i, l_i, K, V, kbase, vbase, cols, skn, svn, dims, qk_scale,
                     MASKED: tl.constexpr, hi, IEEE: tl.constexpr, K_ROWS: tl.constexpr):
        """One BLOCK_N tile of the prefix phase (scores in log2 units); MASKED: the tail tile, cols >= hi hidden.
        K_ROWS: load K as [BLOCK_N, D] rows and transpose in registers, else as a [D, BLOCK_N] strided view."""
        if K_ROWS:
            if MASKED:
                cmask = cols < hi
                k = tl.trans(tl.load(K + kbase + cols[:, None] * skn + dims[None, :], mask=cmask[:, None], other=0.0))
            else:
                k = tl.trans(tl.load(K + kbase + cols[:, None] * skn + dims[None, :]))
        elif MASKED:
            cmask = cols < hi
            k = tl.load(K + kbase + cols[None, :] * skn + dims[:, None], mask=cmask[None, :], other=0.0)
        else:
            k = tl.load(K + kbase + cols[None, :] * skn + dims[:, None])
        if IEEE:
            s = tl.dot(q, k, input_precision="ieee") * qk_scale
        else:
            s = tl.dot(q, k) * qk_scale
        if MASKED:
            s = tl.where((cols < hi)[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if MASKED:
            v = tl.load(V + vbase + cols[:, None] * svn + dims[None, :], mask=(cols < hi)[:, None], other=0.0)
        else:
            v = tl.load(V + vbase + cols[:, None] * svn + dims[None, :])
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        return acc, m_new, l_i

    @triton.jit
    def _visible_tile(q, acc, m_i, l_i, K, V, kbase, vbase, slots, jmask, vis, skn, svn, dims, qk_scale,
                      IEEE: tl.constexpr, K_ROWS: tl.constexpr):
        """The online-softmax step over one tile of tree slots (jmask: the slots read) where `vis` [rows, tile] says
        which each row sees; both tree tiles' shared body. Every row sees the root (tile 0) first, so m_new stays
        finite (scores in log2 units)."""
        if K_ROWS:
            k = tl.trans(tl.load(K + kbase + slots[:, None] * skn + dims[None, :], mask=jmask[:, None], other=0.0))
        else:
            k = tl.load(K + kbase + slots[None, :] * skn + dims[:, None], mask=jmask[None, :], other=0.0)
        if IEEE:
            s = tl.dot(q, k, input_precision="ieee") * qk_scale
        else:
            s = tl.dot(q, k) * qk_scale
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(V + vbase + slots[:, None] * svn + dims[None, :], mask=jmask[:, None], other=0.0)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        return acc, m_new, l_i

    @triton.jit
    def _tree_tile(q, acc, m_i, l_i, K, V, kbase, vbase, PATH, POS, js, t, depth, rmask, t_last, prefix,
                   skn, svn, spath, dims, qk_scale, IEEE: tl.constexpr, K_ROWS: tl.constexpr):
        """One tile of tree nodes js (slots prefix + js, nodes <= t_last read) for rows at nodes t of depth
        `depth`: row t sees node j iff depth(j) <= depth(t) and path[t, depth(j)] == j (scores in log2 units)."""
        jmask = js <= t_last
        dj = tl.load(POS + js, mask=jmask, other=0).to(tl.int32) - prefix
        on = rmask[:, None] & jmask[None, :] & (dj[None, :] <= depth[:, None])
        pj = tl.load(PATH + t[:, None] * spath + dj[None, :], mask=on, other=-1).to(tl.int32)
        vis = on & (pj == js[None, :])
        return _visible_tile(q, acc, m_i, l_i, K, V, kbase, vbase, prefix + js, jmask, vis, skn, svn, dims, qk_scale,
                             IEEE, K_ROWS)

    @triton.jit
    def _tree_tile_words(q, acc, m_i, l_i, K, V, kbase, vbase, w0, w1, js, j0, t_last, prefix, skn, svn, dims,
                         qk_scale, IEEE: tl.constexpr, K_ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
        """_tree_tile with each row's visibility read off its words (vis_words): bit j % 64 of word j // 64 says
        node j is an ancestor of the row or the row itself; w0 holds the tile's first 64 nodes, w1 (BLOCK_N = 128)
        the next 64. The same visible set as _tree_tile's path test, so the same bits."""
        jmask = js <= t_last
        sh = (js % 64).to(tl.int64)
        if BLOCK_N > 64:
            w = tl.where(((js - j0) < 64)[None, :], w0[:, None], w1[:, None])
        else:
            w = w0[:, None]
        vis = (((w >> sh[None, :]) & 1) != 0) & jmask[None, :]
        return _visible_tile(q, acc, m_i, l_i, K, V, kbase, vbase, prefix + js, jmask, vis, skn, svn, dims, qk_scale,
                             IEEE, K_ROWS)

    @triton.jit(do_not_specialize=["M", "T", "n_split", "spc", "sw", "swc"])
    def _tree_attn_kernel(Q, K, V, PATH, POS, PREFIX, O, PACC, PM, PL, COUNT, WORDS,
                          M, T, G, n_split, qk_scale,
                          sqh, skh, skn, svh, svn, spath, sot,
                          n_kv, sqc, skc, svc, spc, soc, sw, swc,
                          D: tl.constexpr, L1P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          SPLIT: tl.constexpr, IEEE: tl.constexpr, K_ROWS: tl.constexpr,
                          TREE_DENSE: tl.constexpr = False, FOLD: tl.constexpr = False, USE_GDC: tl.constexpr = False,
                          VIS_WORDS: tl.constexpr = False, GDC_LATE: tl.constexpr = False):
        pdl.enter(USE_GDC, GDC_LATE)
        c, h, hh = _slot_of(n_kv)   # slot c's tree and region: every pointer below moves by its slot stride first
        c64 = c.to(tl.int64)
        Q += c64 * sqc
        K += c64 * skc
        V += c64 * svc
        PATH += c64 * spc
        WORDS += c64 * swc
        POS += c * T
        PREFIX += c
        O += c64 * soc
        pid_m = tl.program_id(1)
        s_id = tl.program_id(2)
        prefix = tl.load(PREFIX).to(tl.int32)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < M
        t = tl.where(rmask, rows // G, 0)        # t-major folding: row = t * G + query head in the group
        qh = h * G + rows % G
        dims = tl.arange(0, D)
        q = tl.load(Q + qh[:, None] * sqh + t[:, None] * D + dims[None, :], mask=rmask[:, None], other=0.0)
        m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)   # NEG_BIG
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
        kbase = h * skh
        vbase = h * svh
        # prefix phase: this program's range of [0, prefix), full tiles then one masked tail (split: ranges
        # 0..n_split-1; range n_split is the tree phase alone, so it runs beside them, not after one)
        per = tl.cdiv(tl.cdiv(prefix, BLOCK_N), n_split) * BLOCK_N
        lo = s_id * per
        hi = tl.minimum(lo + per, prefix)
        full = lo + tl.maximum(hi - lo, 0) // BLOCK_N * BLOCK_N
        for n0 in range(lo, full, BLOCK_N):
            acc, m_i, l_i = _prefix_step(q, acc, m_i, l_i, K, V, kbase, vbase, n0 + tl.arange(0, BLOCK_N), skn, svn,
                                         dims, qk_scale, False, hi, IEEE, K_ROWS)
        if full < hi:
            acc, m_i, l_i = _prefix_step(q, acc, m_i, l_i, K, V, kbase, vbase, full + tl.arange(0, BLOCK_N), skn, svn,
                                         dims, qk_scale, True, hi, IEEE, K_ROWS)
        # tree phase: the row's ancestors and itself, path[t, 0..depth(t)], to the block's deepest row only
        # (dense: every node tile up to the block's last node, masked by visibility)
        if s_id == (n_split if SPLIT else 0):
            if TREE_DENSE and VIS_WORDS:
                # each row's words (vis_words): a tile none of the block's rows sees is skipped, as below
                t_last = tl.max(tl.where(rmask, t, 0), axis=0)
                wrow = WORDS + t * sw
                for j0 in range(0, t_last + 1, BLOCK_N):
                    w0 = tl.load(wrow + j0 // 64, mask=rmask, other=0)
                    if BLOCK_N > 64:
                        w1 = tl.load(wrow + j0 // 64 + 1, mask=rmask & (t * 0 + j0 + 64 <= t_last), other=0)
                        seen = (w0 | w1) != 0
                    else:
                        w1 = w0
                        if BLOCK_N < 64:   # the tile's bits of its word only
                            w1 = (w0 >> (tl.zeros_like(w0) + j0 % 64)) & ((1 << BLOCK_N) - 1)
                        seen = w1 != 0
                    if tl.sum(seen.to(tl.int32), axis=0) > 0:
                        acc, m_i, l_i = _tree_tile_words(q, acc, m_i, l_i, K, V, kbase, vbase, w0, w1,
                                                         j0 + tl.arange(0, BLOCK_N), j0, t_last, prefix, skn, svn,
                                                         dims, qk_scale, IEEE, K_ROWS, BLOCK_N)
            else:
                depth = tl.load(POS + t, mask=rmask, other=0).to(tl.int32) - prefix
                if TREE_DENSE:
                    t_last = tl.max(tl.where(rmask, t, 0), axis=0)
                    # the block's ancestors (path table, -1 where unused): a tile holding none of them is skipped
                    ds = tl.arange(0, L1P)
                    anc = tl.load(PATH + t[:, None] * spath + ds[None, :],
                                  mask=rmask[:, None] & (ds[None, :] <= depth[:, None]), other=-1).to(tl.int32)
                    for j0 in range(0, t_last + 1, BLOCK_N):
                        hits = tl.sum(tl.sum(((anc >= j0) & (anc < j0 + BLOCK_N)).to(tl.int32), axis=1), axis=0)
                        if hits > 0:
                            acc, m_i, l_i = _tree_tile(q, acc, m_i, l_i, K, V, kbase, vbase, PATH, POS,
                                                       j0 + tl.arange(0, BLOCK_N), t, depth, rmask, t_last, prefix, skn,
                                                       svn, spath, dims, qk_scale, IEEE, K_ROWS)
                else:
                    deepest = tl.max(tl.where(rmask, depth, 0), axis=0)
                    # the block's whole path table at once, so each depth step waits on one round of loads (K and V
                    # together), not three (path, then K, then V)
                    js = tl.arange(0, L1P)
                    paths = tl.load(PATH + t[:, None] * spath + js[None, :],
                                    mask=rmask[:, None] & (js[None, :] <= depth[:, None]), other=0).to(tl.int32)
                    qf = q.to(tl.float32)
                    for j in range(0, deepest + 1):
                        ok = rmask & (j <= depth)
                        slot = prefix + tl.sum(tl.where(js[None, :] == j, paths, 0), axis=1)
                        k = tl.load(K + kbase + slot[:, None] * skn + dims[None, :], mask=ok[:, None], other=0.0)
                        v = tl.load(V + vbase + slot[:, None] * svn + dims[None, :], mask=ok[:, None], other=0.0)
                        s = tl.where(ok, tl.sum(qf * k.to(tl.float32), axis=1) * qk_scale, float("-inf"))
                        m_new = tl.maximum(m_i, s)
                        alpha = tl.exp2(m_i - m_new)
                        p = tl.exp2(s - m_new)
                        l_i = l_i * alpha + p
                        acc = acc * alpha[:, None] + p.to(v.dtype).to(tl.float32)[:, None] * v.to(tl.float32)
                        m_i = m_new
        pdl.release(USE_GDC, GDC_LATE)
        if SPLIT:   # partials [ranges, C * n_kv, M, D]: program hh's rows
            base = (s_id * tl.num_programs(0) + hh) * M + rows
            tl.store(PM + base, m_i / 1.4426950408889634, mask=rmask)   # the combine works in natural-log units
            tl.store(PL + base, l_i, mask=rmask)
            tl.store(PACC + base[:, None] * D + dims[None, :], acc, mask=rmask[:, None])
            if FOLD:   # the last range of this row block to finish combines them all (attention.py's docstring)
                idx = hh * tl.num_programs(1) + pid_m
                if _last_of_block(COUNT, idx, tl.num_programs(2)):
                    out = _reduce_ranges(PACC, PM, PL, rows, rmask, M, tl.num_programs(0), hh, tl.num_programs(2),
                                         BLOCK_M, D)
                    tl.store(O + t[:, None] * sot + qh[:, None] * D + dims[None, :], out.to(O.dtype.element_ty),
                             mask=rmask[:, None])
                    tl.store(COUNT + idx, 0)
        else:
            out = acc / l_i[:, None]
            tl.store(O + t[:, None] * sot + qh[:, None] * D + dims[None, :], out.to(O.dtype.element_ty),
                     mask=rmask[:, None])


def wanted(q: torch.Tensor, k: torch.Tensor, slots: int = 1) -> bool:
    """auto's choice for a tree verify, q [Hq, T, D] against k [Hkv, S, D] (one slot's; the same for each slot of a
    slotted call over `slots` slots): this kernel where it runs and the folded query rows g*T reach TREE_MIN_ROWS
    (below, kernels/attention.py's live-slot kernel, whose masked triangle is cheap there). In an A/B
    DDTREE_TREE_MIN_ROWS moves the edge, DDTREE_SLOT_TREE_MIN_ROWS that over 2+ slots alone."""
    D = q.shape[-1]
    rows = (q.shape[0] // k.shape[0]) * q.shape[1]
    least = experimental.knob("TREE_MIN_ROWS", TREE_MIN_ROWS)
    if slots > 1:
        least = experimental.knob("SLOT_TREE_MIN_ROWS", least)
    return available(q.device) and D == _pow2(D) and D >= 16 and rows >= least


def ranges_for(cfg: Config, C: int, Hkv: int, M: int, S: int) -> int:
    """Prefix ranges of a launch over C slots of M folded rows each: the shape's tuned count (tuned at one slot)
    spread over the slots, ceil(ranges / C) (C slots bring C times the programs, so fewer ranges fill the GPU), or
    ceil(slot_ranges / C) where the shape names those (config's small trees: SLOT_RANGES_SMALL); at most one per
    block_n slots; n_split's count over C * Hkv programs where the shape names none. C = 1: the tuned count."""
    if cfg.ranges is not None:
        spread = cfg.slot_ranges if C > 1 and cfg.slot_ranges is not None else cfg.ranges
        return max(1, min(triton.cdiv(spread, C), triton.cdiv(S, cfg.block_n)))
    return n_split(C * Hkv, M, S, cfg.block_m, cfg.block_n)


def vis_words(path: torch.Tensor, pos: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
    """Each row's visibility as bits: path [T, L+1] or [C, T, L+1], pos [T] or [C*T] (prefix + depth), prefix 0-d or
    [C] -> words [C, T, ceil(T / 64)] int64, bit j % 64 of word j // 64 set iff node j is on row t's path
    (path[t, 0..depth(t)]: its ancestors and itself). Made once per forward (TreeRows), read by every layer's dense
    tree phase instead of gathering path entries per key tile."""
    path3 = path if path.dim() == 3 else path[None]
    C, T, L1 = path3.shape
    if warm.collecting():   # launches recorded, not run (kernels/warm.py): the path table holds no nodes yet
        return torch.zeros(C, T, -(-T // 64), dtype=torch.long, device=path.device)
    depth = pos.view(C, T) - prefix.reshape(-1, 1)
    valid = torch.arange(L1, device=path.device) <= depth[..., None]
    node = torch.where(valid, path3, 0)
    bits = torch.where(valid, torch.bitwise_left_shift(torch.ones_like(node), node % 64), 0)
    words = torch.zeros(C, T, -(-T // 64), dtype=torch.long, device=path.device)
    return words.scatter_add_(2, node // 64, bits)   # distinct bits per word: the sum is their OR


class TreeRows:
    """A tree verify's rows for the tree kernel: the path table and positions (kernels/tree_verify.compile_tree(s)),
    and their vis_words, made on the first layer's call and reused by the others (one forward, one tree)."""

    def __init__(self, path: torch.Tensor, pos: torch.Tensor):
        self.path, self.pos = path, pos
        self._words: torch.Tensor | None = None

    def words(self, prefix: torch.Tensor) -> torch.Tensor:
        if self._words is None:
            self._words = vis_words(self.path, self.pos, prefix)
        return self._words


def tree_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, path: torch.Tensor, pos: torch.Tensor,
                prefix: torch.Tensor, splits: int | None = None, launch: Config | None = None,
                words: torch.Tensor | None = None) -> torch.Tensor:
    """q: [Hq, T, D] (D a power of two >= 16); k, v: [Hkv, S, D] (last dim contiguous); path: [T, L+1] long
    (row t: node at depth 0..depth(t), compile_tree's); pos: [T] long, prefix + depth; prefix: 0-d long,
    the committed slots. Returns [T, Hq*D] in q's dtype: forward.grouped_attend's result with the tree's bias.
    With a leading slot axis (C trees over C regions of a slotted cache, batch_forward.py): q [C, Hq, T, D],
    k, v [C, Hkv, S, D] (any slot stride), path [C, T, L+1] (compile_trees'), pos [C*T] (slot-major), prefix [C];
    slot c's rows see its own prefix and its own tree only; the result is [C*T, Hq*D] slot-major. C = 1 is the
    call above. splits / launch: fixed prefix ranges / launch shape (tests and tuning), else config(M, q's device) and
    ranges_for's count. words: vis_words(path, pos, prefix), for a dense tree phase of block_n <= 128: it then reads
    each row's visibility off them (the same bits as without)."""
    if q.dim() == 3:   # one tree
        q, k, v, path = q[None], k[None], v[None], path[None]
    C, Hq, T, D = q.shape
    if D != _pow2(D) or D < 16:
        raise ValueError(f"tree_attend needs a power-of-two head dim >= 16, got {D} (auto uses the live-slot kernel then)")
    Hkv, S = k.shape[1], k.shape[2]
    G = Hq // Hkv
    M = G * T
    q = q.contiguous()
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        k, v = k.contiguous(), v.contiguous()
    path, pos, prefix = path.contiguous(), pos.contiguous(), prefix.contiguous()
    cfg = launch or config(M, q.dtype, q.device)
    ns = splits if splits is not None else ranges_for(cfg, C, Hkv, M, S)
    out = torch.empty((C * T, Hq * D), dtype=q.dtype, device=q.device)
    if ns > 1:   # ns prefix ranges + the tree phase's partial
        pacc = torch.empty((ns + 1, C * Hkv, M, D), dtype=partial_dtype(q.dtype), device=q.device)
        pm = torch.empty((ns + 1, C * Hkv, M), dtype=torch.float32, device=q.device)
        pl = torch.empty_like(pm)
    else:
        pacc = pm = pl = out
    use_words = words is not None and cfg.tree_dense and cfg.block_n <= 128
    if use_words:
        words = words.view(C, T, -1)
        if words.shape[2] != -(-T // 64) or words.dtype != torch.long or not words.is_contiguous():
            raise ValueError(f"words must be vis_words' [C, T, ceil(T/64)] int64, got {list(words.shape)} {words.dtype}")
    else:
        words = prefix
    grid = (C * Hkv, triton.cdiv(M, cfg.block_m), ns + 1 if ns > 1 else 1)
    fold = cfg.fold and ns > 1
    count = counters(q.device, C * Hkv * grid[1]) if fold else prefix
    W = words.shape[2] if use_words else 0
    warm.launch(_tree_attn_kernel, grid, q, k, v, path, pos, prefix, out, pacc, pm, pl, count, words,
                M, T, G, ns, D ** -0.5 * LOG2E,
                T * D, k.stride(1), k.stride(2), v.stride(1), v.stride(2), path.stride(1), Hq * D,
                Hkv, q.stride(0), k.stride(0), v.stride(0), path.stride(0), T * Hq * D, W, T * W,
                D=D, L1P=_pow2(path.shape[2]), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                SPLIT=ns > 1, IEEE=q.dtype == torch.float32, K_ROWS=cfg.k_rows, TREE_DENSE=cfg.tree_dense,
                FOLD=fold, VIS_WORDS=use_words, num_warps=cfg.warps, num_stages=cfg.stages,
                **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}), **pdl.gdc_options(q.device, out.shape[0]))
    if ns > 1 and not fold:
        combine(pacc, pm, pl, out, prefix, M, T, G, ns + 1, Hkv, t_major=True)
    return out


__all__ = ["Config", "NEG_BIG", "TREE_MIN_ROWS", "TreeRows", "WIDE_SHAPES", "config", "ranges_for",
           "tree_attend", "vis_words", "wanted"]
