"""The DDTree tree build as one Triton kernel (one thread block): ~1 launch instead of ~600.

Same tree as `build_tree` / `StaticTreeBuilder` (same fp32 sums, same exact integer keys, same tie
rule), same algorithm shape as the vectorised build: per depth keep the best F_d = min(B, F_{d-1}*K)
extensions of the previous depth's kept prefixes, then take the global best B by (score, pre-order
index in the trie of kept prefixes). One block is enough because candidates are pruned
(tree_pruned.py: about B*ln(B) per depth, with a certificate); per depth two in-block sorts
(candidates by key; kept ones by lexicographic tie to get their order), then subtree sizes
(atomic adds, bottom-up) and pre-order indices (scans), then one sort of all kept nodes for the
global best B. Scratch lives in preallocated device buffers; the launch has fixed shapes
(graph-capturable). The per-depth top-K of the draft logits comes first (topk.py).
The batched loop's rounds of 2+ slots launch the same kernel over a grid of C programs
(`SlottedTreeBuilder`): program c offsets every per-slot pointer by c times its slot's size (constexpr
products, so the single build, grid (1,), is the same compiled kernel) and builds slot c's tree from its
own log-probs into its own scratch; the shared tables and the certificate flag are one for all slots.
Needs Triton and a CUDA device (or Triton's CPU interpreter, which the tests use);
`available()` says whether it may run (builders.checked_builder checks each size).
"""

from __future__ import annotations

import torch

from ddtree_bench.engine.gpu.kernels.common import _pow2, tl, triton
from ddtree_bench.engine.gpu.kernels.tree_pruned import pruned_inputs, pruned_scratch, slotted_exact, slotted_inputs
from ddtree_bench.engine.gpu.kernels.warm import launch

_SELF_TEST: dict[str, object] = {}   # "ok", and "error": why not (bench-engine's build table shows it)


def available(device) -> bool:
    """Triton is installed and the device is CUDA. Whether a kernel compiles here and builds the PyTorch
    builder's tree is checked per (builder, budget), at its real size, by builders.checked_builder; a
    tiny one-block build here as well would cost a cold process one more compile of the one-block
    kernel, whichever builder it then uses (docs/gpu-performance.md, "Cold start")."""
    if triton is None:
        _SELF_TEST.update(ok=False, error="Triton is not installed")
    elif torch.device(device).type != "cuda":
        _SELF_TEST.update(ok=False, error="not a CUDA device")
    else:
        _SELF_TEST.update(ok=True, error=None)
    return bool(_SELF_TEST["ok"])


if triton is not None:
    from ddtree_bench.engine.gpu.kernels.common import _desc, _undesc
    from ddtree_bench.engine.gpu.kernels.tree_pruned import _boundary_min, _candidates, _depth_one, _emit_nodes, \
        _sizes_and_preorder

    @triton.jit
    def _tree_kernel(lp_ptr, tok_ptr, cnt_ptr, regf_ptr, regr_ptr, bndf_ptr, bndr_ptr,
                     ks_ptr, kl_ptr, lpar_ptr, lr_ptr, ls_ptr, size_ptr, pre_ptr, nodeof_ptr, flag_ptr,
                     tok_out, par_out, dep_out,
                     L: tl.constexpr, K: tl.constexpr, BP: tl.constexpr, RP: tl.constexpr, NP: tl.constexpr,
                     TB: tl.constexpr, JB: tl.constexpr, GB: tl.constexpr, IB: tl.constexpr, N_OUT: tl.constexpr):
        BIG: tl.constexpr = 9223372036854775807
        # program c builds slot c: its [L, K] inputs, [L, BP] scratch, node_of [NP] and [N_OUT] outputs at c times
        # their sizes (the shared tables, cnt .. bndr, and the flag are one for all); the single build is grid (1,)
        c = tl.program_id(0)
        lp_ptr += c * (L * K)
        tok_ptr += c * (L * K)
        ks_ptr += c * (L * BP)
        kl_ptr += c * (L * BP)
        lpar_ptr += c * (L * BP)
        lr_ptr += c * (L * BP)
        ls_ptr += c * (L * BP)
        size_ptr += c * (L * BP)
        pre_ptr += c * (L * BP)
        nodeof_ptr += c * NP
        tok_out += c * N_OUT
        par_out += c * N_OUT
        dep_out += c * N_OUT
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


def _block_shapes(b, device, slots: int = 0) -> None:
    """The one-block kernel's own constants (NP, JB, IB key bits; warps) and node_of scratch ([NP], or
    [slots, NP]), on a builder pruned_scratch has set up."""
    RP, BP = b.RP, b.BP
    b.NP = _pow2(b.L * BP)
    b.JB = max(1, (RP - 1).bit_length())
    b.IB = max(1, (b.NP - 1).bit_length())
    if 32 + b.TB > 63 or 32 + b.GB + b.IB > 63 or b.TB + b.JB > 63:
        raise ValueError(f"budget {b.budget} is too large for the one-block tree kernel")
    b.node_of = torch.zeros((slots, b.NP) if slots else (b.NP,), dtype=torch.int32, device=device)
    b.num_warps = 4 if max(RP, b.NP) <= 1024 else (8 if max(RP, b.NP) <= 4096 else 16)


def _launch_block(b, C: int, lp, tok, tok_out, par_out, dep_out) -> None:
    """The one-block kernel over C programs (program c = slot c; C = 1: the single build)."""
    launch(_tree_kernel, (C,), lp, tok, b.cnt, b.regf, b.regr, b.bndf, b.bndr,
           b.ks, b.kl, b.lpar, b.lr, b.ls, b.size, b.pre, b.node_of, b.flag,
           tok_out, par_out, dep_out,
           L=b.L, K=b.K, BP=b.BP, RP=b.RP, NP=b.NP, TB=b.TB, JB=b.JB, GB=b.GB,
           IB=b.IB, N_OUT=b.N, num_warps=b.num_warps)


class TritonTreeBuilder:
    """Drop-in for StaticTreeBuilder on CUDA: __call__(draft_logits [L, V]) -> (token_ids, parents, depths)
    [N] long. `flag` ([1] int32, device) counts failed pruning certificates since the last reset."""

    name = "triton-block"

    def __init__(self, L: int, V: int, budget: int, device):
        pruned_scratch(self, L, V, budget, device, _pow2)
        _block_shapes(self, device)

    def __call__(self, draft_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        lp, tok, (tok_out, par_out, dep_out) = pruned_inputs(self, draft_logits)
        _launch_block(self, 1, lp, tok, tok_out, par_out, dep_out)
        return tok_out, par_out, dep_out


class SlottedTreeBuilder:
    """The one-block kernel over the slots of a batched round: __call__(draft_logits [C, L, V]), C <= slots ->
    batch_tree.BatchTrees ([C, N] token_ids, parents, depths), row c = slot c's tree, in ONE launch of C
    programs, program c building slot c from its own [L, K] log-probs / ids into its own scratch (preallocated
    for `slots`; fixed shapes, so one CUDA graph per bucket replays it). The compiled kernel is the single
    build's (TritonTreeBuilder: the same constants; C = 1 is that launch). The log-probs and ids are
    `exact.logprobs` (batch_tree.BatchTreeBuilder: each slot's log-softmax normaliser taken on its own [L, V]
    block), the very inputs of the exact batched builder, so a certified tree is that builder's row for row.
    `flag` ([1] int32) counts failed certificates of every slot since the last reset: any slot failing makes
    the caller redo the whole round with `exact`."""

    name = "triton-block-slotted"

    def __init__(self, L: int, V: int, budget: int, device, slots: int, exact=None):
        pruned_scratch(self, L, V, budget, device, _pow2, slots=max(slots, 1))
        _block_shapes(self, device, max(slots, 1))
        self.slots = slots
        self.exact = slotted_exact(self, slots, exact)

    def __call__(self, draft_logits: torch.Tensor):
        from ddtree_bench.engine.gpu.batch_tree import BatchTrees

        C, lp, tok, outs = slotted_inputs(self, draft_logits)
        _launch_block(self, C, lp, tok, *outs)
        return BatchTrees(*outs)
