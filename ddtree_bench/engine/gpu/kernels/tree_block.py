"""The DDTree tree build as one Triton kernel (one thread block): ~1 launch instead of ~600.

Same tree as `build_tree` / `build_tree_fast` (same fp32 sums, same exact integer keys, same tie
rule), same algorithm shape as the vectorised build: per depth keep the best F_d = min(B, F_{d-1}*K)
extensions of the previous depth's kept prefixes, then take the global best B by (score, pre-order
index in the trie of kept prefixes). What makes one block enough:
* candidate pruning: with parents f in key order and ranks r sorted, candidate (f, r) is beaten by
  every (f', r') with f' <= f, r' <= r, so only (f+1)(r+1) <= B can be among the best B; that is
  about B*ln(B) candidates per depth (7.7k at B = 1024) instead of B*K. The "beaten" argument can
  fail only when fp32 sums round to exact ties, so every depth checks a certificate: the worst
  kept key must beat the best excluded key (row f's first excluded rank, since keys grow along a
  row). If a check ever fails the kernel raises a flag and the caller rebuilds the tree with the
  exact PyTorch builder (the round is redone; nothing was committed);
* per depth two in-block sorts (candidates by key; kept ones by lexicographic tie to get their
  order), then subtree sizes (atomic adds, bottom-up) and pre-order indices (scans), then one sort
  of all kept nodes for the global best B.
Scratch lives in preallocated device buffers; the launch has fixed shapes (graph-capturable).
The per-depth top-K of the draft logits comes first, from `topk_triton` (two launches, K <= 4096) or
PyTorch (`tree_static.topk_logprobs`).
The pieces the grid build (tree_grid.py) shares live here: `pruned_regions` / `pruned_scratch`
(candidate tables, scratch arrays) and the jit helpers `_depth_one`, `_candidates`, `_boundary_min`
and `_sizes_and_preorder`.
Needs Triton and a CUDA device; `available()` says whether it can run.
"""

from __future__ import annotations

import torch

try:  # Triton ships with CUDA builds of PyTorch; CPU installs may lack it
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - depends on the install
    triton = None
    tl = None

from ddtree_bench.engine.tree_static import depth_counts


_SELF_TEST: dict[str, object] = {}


def available(device) -> bool:
    """Triton is installed, the device is CUDA, and a small tree built by the kernel equals the heap's
    (checked once per process; a compile or runtime failure makes callers use the PyTorch builder)."""
    if triton is None or torch.device(device).type != "cuda":
        return False
    if "ok" not in _SELF_TEST:
        try:
            from ddtree_bench.engine.tree import build_tree

            logits = torch.randn(5, 11, generator=torch.Generator().manual_seed(0))
            tb = TritonTreeBuilder(5, 11, 9, device)
            got = [t.tolist() for t in tb(logits.to(device))]
            ref = build_tree(logits, 9)
            _SELF_TEST["ok"] = got == [ref.token_ids.tolist(), ref.parents.tolist(), ref.depths.tolist()]
            _SELF_TEST["error"] = None if _SELF_TEST["ok"] else "kernel tree differs from the heap's"
        except Exception as e:  # pragma: no cover - needs a GPU
            _SELF_TEST["ok"], _SELF_TEST["error"] = False, f"{type(e).__name__}: {e}"
        if not _SELF_TEST["ok"]:
            import warnings

            warnings.warn(f"Triton tree kernel unavailable, using the PyTorch builder: {_SELF_TEST['error']}")
    return bool(_SELF_TEST["ok"])


def _pow2(n: int) -> int:
    return 1 << max(0, (max(1, n) - 1).bit_length())


if triton is not None:

    @triton.jit
    def _desc(x):
        """fp32 -> int64 key, higher score -> smaller key, -0.0 == +0.0 (tree._desc_key)."""
        i = x.to(tl.int32, bitcast=True)
        i = tl.where(i == -2147483648, 0, i)
        ordinal = tl.where(i >= 0, i, i ^ 2147483647)
        return 2147483647 - ordinal.to(tl.int64)

    @triton.jit
    def _undesc(k):
        ordinal = (2147483647 - k).to(tl.int32)
        i = tl.where(ordinal >= 0, ordinal, ordinal ^ 2147483647)
        return i.to(tl.float32, bitcast=True)

    @triton.jit
    def _max_combine(a, b):
        return tl.maximum(a, b)

    @triton.jit
    def _depth_one(lp_ptr, ks_ptr, kl_ptr, lpar_ptr, lr_ptr, ls_ptr, size_ptr, K: tl.constexpr, KP: tl.constexpr):
        """Depth 1 (index 0): the top-K tokens; key order = lexicographic order = rank order."""
        j = tl.arange(0, KP)
        m = j < K
        s = tl.load(lp_ptr + j, mask=m, other=0.0)
        tl.store(ks_ptr + j, s, mask=m)
        tl.store(kl_ptr + j, j, mask=m)
        tl.store(lpar_ptr + j, tl.zeros([KP], tl.int32), mask=m)
        tl.store(lr_ptr + j, j, mask=m)
        tl.store(ls_ptr + j, s, mask=m)
        tl.store(size_ptr + j, tl.full([KP], 1, tl.int32), mask=m)

    @triton.jit
    def _candidates(d, i, regf_ptr, regr_ptr, ks_ptr, kl_ptr, lp_ptr, K: tl.constexpr, RP: tl.constexpr,
                    BP: tl.constexpr, TB: tl.constexpr):
        """Candidates i of depth d's region: (key, score, tie, valid). score = parent's score + the token's
        log-prob (fp32), tie = parent's lexicographic position * K + token rank, key = (_desc(score) << TB)
        | tie; invalid slots get the largest key."""
        f = tl.load(regf_ptr + d * RP + i, mask=i < RP, other=-1)
        r = tl.load(regr_ptr + d * RP + i, mask=i < RP, other=0)
        valid = f >= 0
        s = tl.load(ks_ptr + (d - 1) * BP + f, mask=valid, other=0.0)
        lx = tl.load(kl_ptr + (d - 1) * BP + f, mask=valid, other=0)
        lpv = tl.load(lp_ptr + d * K + r, mask=valid, other=0.0)
        score = s + lpv
        tie = lx.to(tl.int64) * K + r.to(tl.int64)
        key = tl.where(valid, (_desc(score) << TB) | tie, 9223372036854775807)
        return key, score, tie, valid

    @triton.jit
    def _boundary_min(d, bndf_ptr, bndr_ptr, ks_ptr, kl_ptr, lp_ptr, K: tl.constexpr, BP: tl.constexpr,
                      TB: tl.constexpr):
        """The best (smallest) key among the pruned rows' first excluded candidates at depth d: the worst
        kept key must be smaller (the certificate)."""
        b = tl.arange(0, BP)
        bf = tl.load(bndf_ptr + d * BP + b)
        br = tl.load(bndr_ptr + d * BP + b)
        bvalid = bf >= 0
        bs = tl.load(ks_ptr + (d - 1) * BP + bf, mask=bvalid, other=0.0)
        bl = tl.load(kl_ptr + (d - 1) * BP + bf, mask=bvalid, other=0)
        blp = tl.load(lp_ptr + d * K + br, mask=bvalid, other=0.0)
        bkey = tl.where(bvalid, (_desc(bs + blp) << TB) | (bl.to(tl.int64) * K + br.to(tl.int64)),
                        9223372036854775807)
        return tl.min(bkey, axis=0)

    @triton.jit
    def _sizes_and_preorder(cnt_ptr, lpar_ptr, size_ptr, pre_ptr, L: tl.constexpr, BP: tl.constexpr):
        """In one block, over the lexicographic-order arrays [L, BP]: subtree sizes bottom-up (size
        starts at 1 for every kept prefix), then pre-order index = lexicographic rank among all kept
        prefixes (depth-1 prefixes by running sums; deeper ones after their parent and older siblings)."""
        lane = tl.arange(0, BP)
        for e in range(1, L):
            d = L - e
            Fd = tl.load(cnt_ptr + d)
            m = lane < Fd
            p = tl.load(lpar_ptr + d * BP + lane, mask=m, other=0)
            sz = tl.load(size_ptr + d * BP + lane, mask=m, other=0)
            tl.atomic_add(size_ptr + (d - 1) * BP + p, sz, mask=m)
            tl.debug_barrier()
        m0 = lane < tl.load(cnt_ptr)
        sz = tl.load(size_ptr + lane, mask=m0, other=0)
        tl.store(pre_ptr + lane, tl.cumsum(sz, axis=0) - sz, mask=m0)
        tl.debug_barrier()
        for d in range(1, L):
            Fd = tl.load(cnt_ptr + d)
            m = lane < Fd
            sz = tl.load(size_ptr + d * BP + lane, mask=m, other=0)
            before = tl.cumsum(sz, axis=0) - sz
            p = tl.load(lpar_ptr + d * BP + lane, mask=m, other=0)
            pprev = tl.load(lpar_ptr + d * BP + lane - 1, mask=m & (lane > 0), other=-1)
            first = p != pprev
            gstart = tl.associative_scan(tl.where(first, before, 0), 0, _max_combine)
            base = tl.load(pre_ptr + (d - 1) * BP + p, mask=m, other=0) + 1
            tl.store(pre_ptr + d * BP + lane, base + before - gstart, mask=m)
            tl.debug_barrier()

    @triton.jit
    def _emit_nodes(p, g, m, nodeof_ptr, lpar_ptr, lr_ptr, tok_ptr, tok_out, par_out, dep_out, K: tl.constexpr,
                    BP: tl.constexpr):
        """Output rows p (pop order) from kept nodes g (flat [depth, lexicographic] index): token, depth,
        and parent node number (node_of of the parent's slot; 0 = root) - both tree builds end here."""
        d = g // BP
        r = tl.load(lr_ptr + g, mask=m, other=0)
        tl.store(tok_out + p, tl.load(tok_ptr + d * K + r, mask=m, other=0), mask=m)
        tl.store(dep_out + p, (d + 1).to(tl.int64), mask=m)
        pp = tl.load(lpar_ptr + g, mask=m, other=0)
        par = tl.load(nodeof_ptr + (d - 1) * BP + pp, mask=m & (d > 0), other=0)
        tl.store(par_out + p, tl.where(d > 0, par, 0).to(tl.int64), mask=m)

    @triton.jit
    def _tree_kernel(lp_ptr, tok_ptr, cnt_ptr, regf_ptr, regr_ptr, bndf_ptr, bndr_ptr,
                     ks_ptr, kl_ptr, lpar_ptr, lr_ptr, ls_ptr, size_ptr, pre_ptr, nodeof_ptr, flag_ptr,
                     tok_out, par_out, dep_out,
                     L: tl.constexpr, K: tl.constexpr, BP: tl.constexpr, RP: tl.constexpr, NP: tl.constexpr,
                     TB: tl.constexpr, JB: tl.constexpr, GB: tl.constexpr, IB: tl.constexpr, N_OUT: tl.constexpr):
        BIG: tl.constexpr = 9223372036854775807
        lane_r = tl.arange(0, RP)

        _depth_one(lp_ptr, ks_ptr, kl_ptr, lpar_ptr, lr_ptr, ls_ptr, size_ptr, K, BP)
        tl.debug_barrier()

        for d in range(1, L):
            Fd = tl.load(cnt_ptr + d)
            key, _, _, _ = _candidates(d, lane_r, regf_ptr, regr_ptr, ks_ptr, kl_ptr, lp_ptr, K, RP, BP, TB)
            skey = tl.sort(key)
            kept = lane_r < Fd
            # certificate: the worst kept key beats every excluded candidate's key
            worst = tl.max(tl.where(kept, skey, -1), axis=0)
            if worst > _boundary_min(d, bndf_ptr, bndr_ptr, ks_ptr, kl_ptr, lp_ptr, K, BP, TB):
                tl.atomic_add(flag_ptr, 1)
            ktie = skey & ((1 << TB) - 1)
            kscore = _undesc(skey >> TB)
            tl.store(ks_ptr + d * BP + lane_r, kscore, mask=kept)
            # lexicographic order of the kept ones: sort (tie, key-order index)
            lkey = tl.where(kept, (ktie << JB) | lane_r.to(tl.int64), BIG)
            slk = tl.sort(lkey)
            j = (slk & ((1 << JB) - 1)).to(tl.int32)
            ltie = slk >> JB
            tl.store(kl_ptr + d * BP + j, lane_r, mask=kept)
            tl.store(lpar_ptr + d * BP + lane_r, (ltie // K).to(tl.int32), mask=kept)
            tl.store(lr_ptr + d * BP + lane_r, (ltie % K).to(tl.int32), mask=kept)
            tl.store(size_ptr + d * BP + lane_r, tl.full([RP], 1, tl.int32), mask=kept)
            tl.debug_barrier()
            tl.store(ls_ptr + d * BP + lane_r, tl.load(ks_ptr + d * BP + j, mask=kept, other=0.0), mask=kept)
            tl.debug_barrier()

        _sizes_and_preorder(cnt_ptr, lpar_ptr, size_ptr, pre_ptr, L, BP)

        # the global best N_OUT by (score, pre-order index), in pop order
        g = tl.arange(0, NP)
        gd = g // BP
        gi = g % BP
        gm = (gd < L) & (gi < tl.load(cnt_ptr + gd, mask=gd < L, other=0))
        sc = tl.load(ls_ptr + g, mask=gm, other=0.0)
        pr = tl.load(pre_ptr + g, mask=gm, other=0)
        gkey = tl.where(gm, (((_desc(sc) << GB) | pr.to(tl.int64)) << IB) | g.to(tl.int64), BIG)
        sg = tl.sort(gkey)
        chosen = g < N_OUT
        cg = (sg & ((1 << IB) - 1)).to(tl.int32)
        tl.store(nodeof_ptr + cg, g + 1, mask=chosen)
        tl.debug_barrier()
        _emit_nodes(g, cg, chosen, nodeof_ptr, lpar_ptr, lr_ptr, tok_ptr, tok_out, par_out, dep_out, K, BP)


def pruned_regions(L: int, V: int, budget: int) -> tuple[int, list[int], list[tuple[list[int], list[int]]],
                                                          list[tuple[list[int], list[int]]]]:
    """K, prefixes kept per depth, and per depth d >= 1 the candidate region (parent f in key order,
    token rank r) with (f+1)(r+1) <= budget, plus the boundary (f, first excluded r) of every pruned
    row, whose best key the worst kept one must beat (the certificate). Index 0 is empty."""
    K, counts = depth_counts(L, V, budget)
    regions, bounds = [([], [])], [([], [])]
    for d in range(1, L):
        F = counts[d - 1]
        fs, rs, bfs, brs = [], [], [], []
        for f in range(F):
            lim = min(K, budget // (f + 1))
            fs += [f] * lim
            rs += list(range(lim))
            if lim < K:
                bfs.append(f)
                brs.append(lim)
        if len(fs) < counts[d]:  # pruning would keep too few: take every candidate, no certificate needed
            fs = [f for f in range(F) for _ in range(K)]
            rs = [r for _ in range(F) for r in range(K)]
            bfs, brs = [], []
        regions.append((fs, rs))
        bounds.append((bfs, brs))
    return K, counts, regions, bounds


KERNELS = ("block", "grid", "grid-keys")


def checked_builder(L: int, V: int, budget: int, device, kernel: str = "block"):
    """A Triton builder (kernel "block": TritonTreeBuilder, "grid" / "grid-keys": tree_grid.GridTreeBuilder
    without / with keys_first) for this
    (L, V, budget) that compiled, ran and matched the PyTorch builder on random logits here, or None
    (with a warning) - so a kernel that cannot build at some size (resources, a Triton version) costs
    speed, never a crash or a wrong tree."""
    if not available(device):
        return None
    try:
        from ddtree_bench.engine.tree_grid import GridTreeBuilder
        from ddtree_bench.engine.tree_static import StaticTreeBuilder

        logits = torch.randn(L, V, generator=torch.Generator().manual_seed(budget)).to(device) * 3
        if kernel not in KERNELS:
            raise ValueError(f"unknown tree kernel {kernel!r}: {' | '.join(KERNELS)}")
        tb = (TritonTreeBuilder(L, V, budget, device) if kernel == "block"
              else GridTreeBuilder(L, V, budget, device, keys_first=kernel == "grid-keys"))
        got = tb(logits)
        ref = StaticTreeBuilder(L, V, budget, device)(logits)
        if tb.flag.item() == 0 and all(torch.equal(a, b) for a, b in zip(got, ref)):
            return tb
        error = "its tree differs from the PyTorch builder's"
    except Exception as e:  # pragma: no cover - needs a GPU
        error = f"{type(e).__name__}: {e}"
    import warnings

    warnings.warn(f"Triton {kernel} tree kernel unusable at budget {budget}, using another builder: {error}")
    return None


def pruned_scratch(b, L: int, V: int, budget: int, device, round_regions) -> None:
    """Set up a pruned tree builder `b` (one-block or grid): shape constants (K, counts, N, BP, R =
    candidates per depth, RP = round_regions(max R), TB and GB key bits), the regions and boundaries as padded device
    tables, and the scratch arrays [L, BP] both kernels fill (key order: ks, kl; lexicographic
    order: lpar, lr, ls, size, pre) plus the certificate flag."""
    if budget <= 0 or L <= 0:
        raise ValueError(f"{type(b).__name__} needs budget > 0 and L > 0")
    dev = torch.device(device)
    b.L, b.V, b.budget = L, V, budget
    K, counts, regions, bounds = pruned_regions(L, V, budget)
    b.K, b.counts = K, counts
    total = sum(counts)
    b.N = min(budget, total)
    BP = b.BP = _pow2(max(counts))
    b.R = [len(f) for f, _ in regions]       # candidates per depth (0 at depth 1)
    RP = b.RP = round_regions(max(b.R))
    pad = lambda xs, n: xs + [-1] * (n - len(xs))  # noqa: E731
    i32 = dict(dtype=torch.int32, device=dev)
    b.cnt = torch.tensor(counts, **i32)
    b.regf = torch.tensor([pad(f, RP) for f, _ in regions], **i32)
    b.regr = torch.tensor([pad(r, RP) for _, r in regions], **i32)
    b.bndf = torch.tensor([pad(f, BP) for f, _ in bounds], **i32)
    b.bndr = torch.tensor([pad(r, BP) for _, r in bounds], **i32)
    b.TB = max(1, (budget * K).bit_length())
    b.GB = max(1, total.bit_length())
    f32 = dict(dtype=torch.float32, device=dev)
    b.ks, b.ls = torch.zeros(L, BP, **f32), torch.zeros(L, BP, **f32)
    b.kl, b.lpar, b.lr = (torch.zeros(L, BP, **i32) for _ in range(3))
    b.size, b.pre = torch.zeros(L, BP, **i32), torch.zeros(L, BP, **i32)
    b.flag = torch.zeros(1, **i32)


def pruned_inputs(b, draft_logits: torch.Tensor):
    """A pruned builder's kernel inputs: (lp, tok) [L, K] contiguous (fused top-K where it applies) and
    the three [N] long outputs (token ids, parents, depths) to fill."""
    from ddtree_bench.engine.topk_triton import topk_logprobs_fused  # (it imports this module)

    lp, tok = topk_logprobs_fused(draft_logits, b.K)
    outs = [torch.empty(b.N, dtype=torch.long, device=draft_logits.device) for _ in range(3)]
    return lp.contiguous(), tok.contiguous(), outs


class TritonTreeBuilder:
    """Drop-in for StaticTreeBuilder on CUDA: __call__(draft_logits [L, V]) -> (token_ids, parents, depths)
    [N] long. `flag` ([1] int32, device) counts failed pruning certificates since the last reset."""

    name = "triton-block"

    def __init__(self, L: int, V: int, budget: int, device):
        pruned_scratch(self, L, V, budget, device, _pow2)
        RP, BP = self.RP, self.BP
        self.NP = _pow2(L * BP)
        self.JB = max(1, (RP - 1).bit_length())
        self.IB = max(1, (self.NP - 1).bit_length())
        if 32 + self.TB > 63 or 32 + self.GB + self.IB > 63 or self.TB + self.JB > 63:
            raise ValueError(f"budget {budget} is too large for the one-block tree kernel")
        self.node_of = torch.zeros(self.NP, dtype=torch.int32, device=device)
        self.num_warps = 4 if max(RP, self.NP) <= 1024 else (8 if max(RP, self.NP) <= 4096 else 16)

    def __call__(self, draft_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        lp, tok, (tok_out, par_out, dep_out) = pruned_inputs(self, draft_logits)
        _tree_kernel[(1,)](lp, tok, self.cnt, self.regf, self.regr, self.bndf, self.bndr,
                           self.ks, self.kl, self.lpar, self.lr, self.ls, self.size, self.pre, self.node_of, self.flag,
                           tok_out, par_out, dep_out,
                           L=self.L, K=self.K, BP=self.BP, RP=self.RP, NP=self.NP, TB=self.TB, JB=self.JB, GB=self.GB,
                           IB=self.IB, N_OUT=self.N, num_warps=self.num_warps)
        return tok_out, par_out, dep_out
