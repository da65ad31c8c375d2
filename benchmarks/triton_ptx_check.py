"""Compile the engine's tree and attention kernels to PTX for sm_90 (H100/H200) on a machine without a GPU.

Triton's CPU interpreter runs kernels as NumPy and does not type-check them as the compiler does:
H200 run J's commit kernel (a mask named alike in both branches of a runtime `if`) passed every
interpreter test and failed to compile on the GPU. This script runs the compiler's front end and
back end (to PTX) for every tree kernel, with the argument types and compile-time constants the
engine's own builders derive for the Qwen3-8B shape (bf16 logits; budgets 64 and 256), so that
class of error shows up before device time is spent. It checks that each kernel compiles, not what
it computes (the interpreter tests do that), and prints each binary's registers a thread and spilled
(local) bytes where Triton's cuobjdump is at hand. Needs Triton importable, no GPU:
    PYTHONPATH=/tmp/tsite:. python benchmarks/triton_ptx_check.py [--only topk,tree,verify,attention,layer]
Each line ends with the compile time (seconds; a fresh TRITON_CACHE_DIR makes it a cold compile, not a cache hit).
"""

import os
import re
import subprocess
import sys
import tempfile
import time

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ddtree_bench.engine.gpu.kernels import argmax as argmax_triton, topk as topk_triton, tree_block as tree_triton, tree_grid
from ddtree_bench.engine.gpu.kernels import attention as attention_triton, tree_verify as tree_verify_triton
from ddtree_bench.engine.gpu.kernels import normalisers, tree_attention as tree_attention_triton
from ddtree_bench.engine.gpu.kernels.common import _pow2

TARGET = GPUTarget("cuda", 90, 32)
L, V = 15, 151936
TYPES = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.int64: "*i64", torch.int32: "*i32",
         torch.int8: "*i8"}


def t(dtype):
    return torch.empty(1, dtype=dtype)


def check(kernel, args: dict, consts: dict, options: dict | None = None, mma: bool = False) -> bool:
    """args: name -> tensor (pointer) or int (i32); consts: name -> compile-time constant (a constexpr
    parameter with a default that neither names takes its default, as a launch would); options: the launch's
    num_warps / num_stages; mma: also print which tensor-core instructions the PTX holds (wgmma: Hopper's
    warpgroup MMA; mma.sync: the older warp-level one), never failing on either."""
    import inspect

    for name, p in inspect.signature(kernel.fn).parameters.items():
        if name not in args and name not in consts and p.default is not inspect.Parameter.empty:
            consts = {**consts, name: p.default}
    sig = {n: TYPES[a.dtype] if isinstance(a, torch.Tensor) else "fp32" if isinstance(a, float) else "i32"
           for n, a in args.items()}
    sig.update({n: "constexpr" for n in consts})
    name = kernel.fn.__name__
    try:
        t0 = time.perf_counter()
        compiled = triton.compile(ASTSource(kernel, sig, constexprs=consts), target=TARGET, options=options)
        compile_s = time.perf_counter() - t0
        ptx = compiled.asm["ptx"] if mma or consts.get("USE_GDC") else ""
        if os.environ.get("PTX_DUMP"):   # a folder: each compilation's instructions (no debug lines), to diff a refactor
            _dump(name, consts, options, compiled.asm["ptx"])
        tc = f" [wgmma {ptx.count('wgmma.mma_async')}, mma.sync {ptx.count('mma.sync')}]" if mma else ""
        print(f"ok    {name} {consts}{f' {options}' if options else ''}{tc}{_gdc_at(ptx)}{_resources(compiled.asm.get('cubin'))} "
              f"{compile_s:.2f} s")
        return True
    except Exception as e:  # noqa: BLE001 - report every kernel, then fail
        print(f"FAIL  {name} {consts}: {type(e).__name__}: {str(e).splitlines()[-1] if str(e) else ''}")
        return False


def _gdc_at(ptx: str) -> str:
    """' [wait @a%, launch @b%]': where programmatic dependent launch's two instructions sit in the PTX's instruction
    lines (kernels/pdl.py: "pdl-late" lets the next kernel in after the main loop, so its launch sits near the end);
    '' without them."""
    lines = [x.strip() for x in ptx.splitlines() if x.strip() and not x.strip().startswith(("//", ".", "$", "{", "}"))]
    at = {k: next((i for i, x in enumerate(lines) if x.startswith(f"griddepcontrol.{k}")), None)
          for k in ("wait", "launch_dependents")}
    if not lines or all(v is None for v in at.values()):
        return ""
    pct = {k: "-" if v is None else f"{100 * v // len(lines)}%" for k, v in at.items()}
    return f" [wait @{pct['wait']}, launch @{pct['launch_dependents']}]"


def _resources(cubin: bytes | None) -> str:
    """' [REG r, LOCAL l]': registers a thread and local (spilled) bytes of the sm_90 binary, read by the cuobjdump
    that comes with Triton's ptxas (both run without a GPU); '' where either is missing."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not cubin or not os.path.exists(tool):
        return ""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+).*LOCAL:(\d+)", out)
    return f" [REG {m.group(1)}, LOCAL {m.group(2)}]" if m else ""


_DUMPED: dict[str, int] = {}


def _dump(name: str, consts: dict, options: dict | None, ptx: str) -> None:
    """PTX_DUMP/<kernel>.<n>.ptx: the PTX without its debug sections, comments, .loc / .file lines and labels, numbered by
    the order of compilation, so two checkouts' dumps diff by instructions only."""
    n = _DUMPED[name] = _DUMPED.get(name, -1) + 1
    os.makedirs(os.environ["PTX_DUMP"], exist_ok=True)
    ptx = ptx.split(".section\t.debug")[0].split(".section .debug")[0]
    keep = [ln for ln in ptx.splitlines() if not ln.lstrip().startswith(("//", ".loc", ".file", "$L__", ".section"))]
    with open(os.path.join(os.environ["PTX_DUMP"], f"{name}.{n}.ptx"), "w") as f:
        f.write(f"// {consts} {options}\n" + "\n".join(keep) + "\n")


SECTIONS = ("topk", "tree", "verify", "attention", "layer")


def want(section: str) -> bool:
    """Whether to compile `section`: every one, or those named by `--only a,b` (the whole run takes tens of
    minutes on a loaded 2-core machine; one section is what a kernel change needs)."""
    if "--only" not in sys.argv:
        return True
    names = sys.argv[sys.argv.index("--only") + 1].split(",")
    unknown = set(names) - set(SECTIONS)
    if unknown:
        sys.exit(f"--only: unknown section(s) {', '.join(sorted(unknown))}; known: {', '.join(SECTIONS)}")
    return section in names


i64, i32, f32, bf16, i8 = (t(d) for d in (torch.int64, torch.int32, torch.float32, torch.bfloat16, torch.int8))
# the attention kernels' slot axis (runtime arguments): 8 KV heads, a slot's strides in a 2112-slot cache, T = 257
# rows (combine: 17); BATCH_*: the same at a batched verify's slotted cache of 16 regions (kernels/attention.py)
LIVE_SLOTS = dict(n_kv=8, sqc=32 * 257 * 128, skc=8 * 2112 * 128, svc=8 * 2112 * 128, sbc=4 * 257 * 2112, soc=257 * 4096)
TREE_SLOTS = dict(n_kv=8, sqc=32 * 257 * 128, skc=8 * 2112 * 128, svc=8 * 2112 * 128, spc=257 * 16, soc=257 * 4096,
                  WORDS=i64, sw=5, swc=257 * 5)   # visibility words (tree_attention.vis_words): ceil(257 / 64) per row
COMBINE_SLOTS = dict(n_kv=8, soc=17 * 4096)
ok = []
# top-K (both selections; the chunk topk.chunk_for picks: wider from K = 512)
if want("topk"):
    for k in (16, 256, 512, 1024):
        VB = (V - 1).bit_length()
        CH = topk_triton.chunk_for(k, V)
        C = triton.cdiv(V, CH)
        base = dict(x_ptr=bf16, out_ptr=i64, V=V, stride=V, C=C)
        if k <= topk_triton.SELECT_MIN_UP_TO:
            ok.append(check(topk_triton._chunk_kernel, base, dict(K=k, CH=CH, VB=VB)))
            ok.append(check(topk_triton._chunk_min_kernel, dict(x_ptr=bf16, cmin_ptr=i64, V=V, stride=V, C=C),
                            dict(CH=CH, VB=VB)))
            ok.append(check(topk_triton._bound_kernel, dict(cmin_ptr=i64, tau_ptr=i64, C=C), dict(K=k, CP=_pow2(C))))
            ok.append(check(topk_triton._chunk_pruned_kernel, dict(x_ptr=bf16, cmin_ptr=i64, tau_ptr=i64, out_ptr=i64,
                                                                    V=V, stride=V, C=C), dict(K=k, KP=_pow2(k), CH=CH, VB=VB)))
            ok.append(check(topk_triton._merge_kernel, dict(cand_ptr=i64, ids_ptr=i64, C=C), dict(K=k, NP=_pow2(C * k), VB=VB)))
        else:
            for half in (True, False):
                ok.append(check(topk_triton._select_kernel, base, dict(K=k, KP=_pow2(k), CH=CH, VB=VB, HALF=half)))
                n = C * k
                ok.append(check(topk_triton._merge_select_kernel, dict(cand_ptr=i64, ids_ptr=i64, sel_ptr=i64),
                                dict(n=n, K=k, KP=_pow2(k), NP=_pow2(n), VB=VB, HALF=half)))

    # the batched builder's log-probs: the normaliser's max and shifted exp, one program per row (libdevice's exp)
    for x in (bf16, f32):
        ok.append(check(normalisers._shifted_exp_kernel, dict(X=x, E=f32, M=f32, V=V, sx=V),
                        dict(BLOCK=normalisers.BLOCK, LIBDEVICE=True), dict(num_warps=8)))

# one-block tree kernel (B = 64)
if want("tree"):
    b = tree_triton.TritonTreeBuilder(L, V, 64, "cpu")
    ok.append(check(tree_triton._tree_kernel,
                    dict(lp_ptr=f32, tok_ptr=i64, cnt_ptr=i32, regf_ptr=i32, regr_ptr=i32, bndf_ptr=i32, bndr_ptr=i32,
                         ks_ptr=f32, kl_ptr=i32, lpar_ptr=i32, lr_ptr=i32, ls_ptr=f32, size_ptr=i32, pre_ptr=i32,
                         nodeof_ptr=i32, flag_ptr=i32, tok_out=i64, par_out=i64, dep_out=i64),
                    dict(L=L, K=b.K, BP=b.BP, RP=b.RP, NP=b.NP, TB=b.TB, JB=b.JB, GB=b.GB, IB=b.IB, N_OUT=b.N)))
    # the same kernel as the batched loop's slotted build launches it (one program per slot) at its rule's largest
    # budget, builders.AUTO_BLOCK_MAX_BUDGET = 32, with the constants SlottedTreeBuilder derives (16 slots)
    sb = tree_triton.SlottedTreeBuilder(L, V, 32, "cpu", slots=16)
    ok.append(check(tree_triton._tree_kernel,
                    dict(lp_ptr=f32, tok_ptr=i64, cnt_ptr=i32, regf_ptr=i32, regr_ptr=i32, bndf_ptr=i32, bndr_ptr=i32,
                         ks_ptr=f32, kl_ptr=i32, lpar_ptr=i32, lr_ptr=i32, ls_ptr=f32, size_ptr=i32, pre_ptr=i32,
                         nodeof_ptr=i32, flag_ptr=i32, tok_out=i64, par_out=i64, dep_out=i64),
                    dict(L=L, K=sb.K, BP=sb.BP, RP=sb.RP, NP=sb.NP, TB=sb.TB, JB=sb.JB, GB=sb.GB, IB=sb.IB, N_OUT=sb.N),
                    dict(num_warps=sb.num_warps)))

    # grid tree kernels (B = 256), both variants; the slotted build launches these same variants over a slot axis
    g = tree_grid.GridTreeBuilder(L, V, 256, "cpu")
    BI = tree_grid.BI
    ok.append(check(tree_grid._init_kernel, dict(lp_ptr=f32, ks_ptr=f32, kl_ptr=i32, lpar_ptr=i32, lr_ptr=i32, ls_ptr=f32,
                                                 size_ptr=i32), dict(L=L, K=g.K, KP=_pow2(g.K), BP=g.BP)))
    ok.append(check(tree_grid._keys_kernel, dict(regf_ptr=i32, regr_ptr=i32, ks_ptr=f32, kl_ptr=i32, lp_ptr=f32, ckey_ptr=i64,
                                                 d=3), dict(L=L, K=g.K, RP=g.RP, BP=g.BP, TB=g.TB, BI=BI)))
    # the defaults, then the widest probe widths gpu_probe_build.py times (bj, lex_bj, ONCE: _probe.grid_builder)
    R = tree_grid.ROWS
    for keys, bj, rows, lex_bj, once in ((False, tree_grid.BJ, 16, tree_grid.BJ, False),
                                         (True, tree_grid.BJ_KEYS, R, tree_grid.BJ, False),
                                         (True, 1024, R, 256, True), (False, 512, R, 256, True)):
        ok.append(check(tree_grid._rank_kernel,
                        dict(regf_ptr=i32, regr_ptr=i32, ks_ptr=f32, kl_ptr=i32, lp_ptr=f32, bndf_ptr=i32, bndr_ptr=i32,
                             ktie_ptr=i64, flag_ptr=i32, ckey_ptr=i64, d=3, Fd=256),
                        dict(L=L, K=g.K, RP=g.RP, BP=g.BP, TB=g.TB, BI=rows, BJ=bj, KEYS=keys, ONCE=once)))
        ok.append(check(tree_grid._pop_rank_kernel,
                        dict(cnt_ptr=i32, ls_ptr=f32, pre_ptr=i32, node_of_ptr=i32, inv_ptr=i32, gkey_ptr=i64),
                        dict(L=L, BP=g.BP, GB=g.GB, N=g.N, BI=rows, BJ=bj, KEYS=keys, ONCE=once)))
        ok.append(check(tree_grid._lex_kernel, dict(ks_ptr=f32, ktie_ptr=i64, kl_ptr=i32, lpar_ptr=i32, lr_ptr=i32,
                                                    ls_ptr=f32, size_ptr=i32, d=3, Fd=256),
                        dict(L=L, K=g.K, BP=g.BP, BI=rows, BJ=lex_bj)))
    ok.append(check(tree_grid._preorder_kernel, dict(cnt_ptr=i32, lpar_ptr=i32, size_ptr=i32, pre_ptr=i32), dict(L=L, BP=g.BP)))
    ok.append(check(tree_grid._gkeys_kernel, dict(cnt_ptr=i32, ls_ptr=f32, pre_ptr=i32, gkey_ptr=i64),
                    dict(L=L, BP=g.BP, GB=g.GB, BI=BI)))
    ok.append(check(tree_grid._emit_kernel, dict(inv_ptr=i32, node_of_ptr=i32, lpar_ptr=i32, lr_ptr=i32, tok_ptr=i64,
                                                 tok_out=i64, par_out=i64, dep_out=i64), dict(L=L, K=g.K, BP=g.BP, N=g.N, BI=BI)))

# tree compile, walk and commit (B = 256: T = 257; 8B: 4 query heads per KV head, 36 x 8 KV rows of 128)
if want("verify"):
    T = 257
    ok.append(check(tree_verify_triton._compile_kernel,
                    dict(bonus_ptr=i64, tok_ptr=i64, par_ptr=i64, dep_ptr=i64, start_ptr=i64, ids_ptr=i64, pos_ptr=i64,
                         path_ptr=i64, anc_ptr=i8, bias_ptr=bf16, T=T, S=2112),
                    dict(L=L, G=4, TP=_pow2(T), BC=tree_verify_triton.BC, NEG=float("-inf"))))
    ok.append(check(tree_verify_triton._walk_kernel, dict(ids_ptr=i64, par_ptr=i64, dep_ptr=i64, path_ptr=i64, post_ptr=i64,
                                                          out_ptr=i64, stage_ptr=i64, T=T),
                    dict(L=L, TP=_pow2(T), LP=_pow2(L + 1), NODES=1, TOKENS=L + 2, BONUS=2 * L + 3, SIZE=2 * L + 4)))
    # the commit as the single loop launches it (one slot, slot strides 0) and as the batched loop does (16 slots of a
    # slotted cache, live mask, walk rows of 2L + 4, or 2L + 5 with the slotted builder's flag), guarded or not
    for guard in (False, True):
        for live in (False, True):
            walk_row = (2 * L + 5 if guard else 2 * L + 4) if live else 0
            strides = dict(s_layer=16 * 8 * 2112 * 128, s_slot=8 * 2112 * 128 if live else 0,
                           s_ctx=(L + 1) * 20480 if live else 0, s_walk=walk_row)
            ok.append(check(tree_verify_triton._commit_rows_kernel,
                            dict(k_ptr=bf16, v_ptr=bf16, hidden_ptr=bf16, ctx_ptr=bf16, walked_ptr=i64, start_ptr=i64,
                                 live_ptr=i64, S=2112, HKV=8, NLH=288, T=T, CW=20480, hstride=20480, **strides,
                                 FLAG=2 * L + 4),
                            dict(L=L, LP=_pow2(L + 1), D=128, DP=128, BCW=1024, GUARD=guard, LIVE=live, NODES=1)))
            ok.append(check(tree_verify_triton._commit_state_kernel,
                            dict(walked_ptr=i64, start_ptr=i64, ctx_start_ptr=i64, bonus_ptr=i64, live_ptr=i64,
                                 s_walk=walk_row, FLAG=2 * L + 4),
                            dict(BONUS=2 * L + 3, GUARD=guard, LIVE=live)))

    # the walk's argmax over the verify logits (bf16, the Qwen3 vocabulary)
    ok.append(check(argmax_triton._span_kernel, dict(x_ptr=bf16, part_ptr=i64, stride=V),
                    dict(V=V, SPAN=38912, S=4, BLOCK=argmax_triton.BLOCK)))
    ok.append(check(argmax_triton._pick_kernel, dict(part_ptr=i64, out_ptr=i64), dict(S=4, SP=4)))

# live-slot attention and its split combine (8B: 8 KV heads, head dim 128; bf16 and the fp32 tests' IEEE dots), at
# every row block live_attend takes with its launch's warps and stages; the PTX's tensor-core instructions printed
if want("attention"):
    for dt, ptr in ((torch.bfloat16, bf16), (torch.float32, f32)):
        stages = 1 if dt == torch.float32 else 2
        for bm in attention_triton.BLOCK_MS:
            for prefix, split, fold, cap in ((True, True, False, True), (True, True, True, True), (True, True, False, False),
                                             (True, False, False, False), (False, True, False, False),
                                             (False, True, True, True), (False, False, False, False)):
                ok.append(check(attention_triton._live_attn_kernel,
                                dict(Q=ptr, K=ptr, V=ptr, BIAS=ptr, LIVE=i64, PREFIX=i64, O=ptr, PACC=f32 if split else ptr,
                                     PM=f32 if split else ptr, PL=f32 if split else ptr, COUNT=i32 if fold else i64,
                                     M=4 * 257, T=257, G=4, n_split=3,
                                     scale=0.088, sqh=4 * 257 * 128, sqm=128, skh=2112 * 128, skn=128,
                                     svh=2112 * 128, svn=128, sbm=2112, sbn=1, sot=4096, **LIVE_SLOTS),
                                dict(D=128, BLOCK_M=bm, BLOCK_N=attention_triton.BLOCK_N, BLOCK_D=128, HAS_PREFIX=prefix,
                                     SPLIT=split, IEEE=dt == torch.float32, FOLD=fold, CAP=cap),
                                dict(num_warps=8 if bm >= 128 else 4, num_stages=stages), mma=True))
        for sp in (2, 32):
            for t_major, cap in ((False, False), (True, False), (False, True)):
                ok.append(check(attention_triton._combine_kernel, dict(PACC=f32, PM=f32, PL=f32, O=ptr, LIVE=i64, M=4 * 17,
                                                                       T=17, G=4, n_split=3, n_heads=8, sot=4096,
                                                                       **COMBINE_SLOTS),
                                dict(D=128, BLOCK_D=128, SP=sp, T_MAJOR=t_major, CAP=cap)))
        # the verify's tree attention (prefix dense; ancestors gathered or the tree's tiles masked; combine after or
        # folded), at every launch shape `config` picks and the tuning benchmark's (benchmarks/gpu_attention_tune.py),
        # the wide ones (WIDE_SHAPES) with and without the prefix split
        shapes = [(16, 64, True, False, False, False), (16, 64, True, True, False, False),
                  (64, 64, False, False, False, False), (64, 64, False, True, False, False),
                  (128, 128, False, True, False, False), (16, 64, True, False, True, False),
                  (16, 64, True, False, True, True), (16, 64, True, False, False, True),
                  (16, 128, True, True, True, True), (32, 64, False, False, True, False),
                  (64, 64, False, True, True, False)]
        wide = {(c.block_m, c.block_n): c for c in tree_attention_triton.WIDE_SHAPES}
        narrow_n, narrow_stages = tree_attention_triton.NARROW_TILES   # an H100's lower bands ("narrow-tiles" elsewhere)
        wide[(64, narrow_n)] = tree_attention_triton.Config(64, narrow_n, 4, narrow_stages)
        shapes += [(64, narrow_n, split, False, True, False) for split in (False, True)]
        for c in tree_attention_triton.WIDE_SHAPES:
            shapes += [(c.block_m, c.block_n, split, False, dense, fold)
                       for split, dense, fold in ((False, False, False), (False, True, False), (True, False, False),
                                                  (True, True, True))]
        for bm, bn, split, k_rows, dense, fold in shapes:
            c = wide.get((bm, bn))
            warps = c.warps if c else 8 if bm >= 128 else 4
            ok.append(check(tree_attention_triton._tree_attn_kernel,
                            dict(Q=ptr, K=ptr, V=ptr, PATH=i64, POS=i64, PREFIX=i64, O=ptr, PACC=f32 if split else ptr,
                                 PM=f32 if split else ptr, PL=f32 if split else ptr, COUNT=i32 if fold else i64,
                                 M=4 * 257, T=257, G=4, n_split=3,
                                 qk_scale=0.127, sqh=257 * 128, skh=2112 * 128, skn=128, svh=2112 * 128, svn=128,
                                 spath=16, sot=4096, **TREE_SLOTS),
                            dict(D=128, L1P=_pow2(L + 1), BLOCK_M=bm, BLOCK_N=bn, SPLIT=split, IEEE=dt == torch.float32,
                                 K_ROWS=k_rows, TREE_DENSE=dense, FOLD=fold, VIS_WORDS=dense and bn <= 128),
                            dict(num_warps=warps, num_stages=c.stages if c and stages > 1 else stages), mma=True))

# the few-row weight GEMM (split and not, SiLU-mul epilogue, the split reduce) and the layer ops, with and without
# programmatic dependent launch's instructions (kernels/pdl.py: griddepcontrol, the weights' L2 prefetch), and the
# norm that sums a split GEMM's partials
if want("layer"):
    from ddtree_bench.engine.gpu.kernels import gemm as gemm_triton, layer_ops as layer_ops_triton  # noqa: E402

    for gdc, late in ((False, False), (True, False), (True, True)):   # late: "pdl-late"'s launch after the loop
        for bm, bn, bk, sw, part in ((16, 64, 128, False, False), (16, 32, 128, True, True), (64, 64, 64, True, False),
                                     (32, 128, 128, False, True)):
            ok.append(check(gemm_triton._gemm_kernel,
                            dict(X=bf16, W=bf16, Y=f32 if part else bf16, M=17, N=4096, K=4096, k_per_split=1024,
                                 up_rows=4096 if sw else 0, sx=4096, sw=4096, sy=4096, s_split=17 * 4096, prefetch_k=512),
                            dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SWIGLU=sw, PARTIAL=part, EVEN_K=True, PRECISION="tf32",
                                 USE_GDC=gdc, GDC_LATE=late, LINE=64)))
        ok.append(check(gemm_triton._gemm_split_reduce, dict(P=f32, Y=bf16, N=4096, splits=3, up_rows=4096, s_split=17 * 8192,
                                                           sp=8192, sy=4096), dict(SWIGLU=True, BLOCK=1024, USE_GDC=gdc,
                                                                                 GDC_LATE=late)))
        for parts in (False, True):   # parts: a split GEMM's fp32 partials summed by the norm ("fused-reduce")
            ok.append(check(layer_ops_triton._rmsnorm_kernel, dict(X=bf16, R=f32 if parts else bf16, W=bf16, Y=bf16, XO=bf16,
                                                                 N=4096, eps=1e-6, sx=4096, sr=4096, sy=4096, sxo=4096,
                                                                 n_parts=3, s_part=17 * 4096),
                            dict(HAS_RES=True, BLOCK=4096, USE_GDC=gdc, GDC_LATE=late, PARTS=parts)))
        ok.append(check(layer_ops_triton._silu_mul_kernel, dict(GU=bf16, Y=bf16, I=12288, sgu=24576, sy=12288),
                        dict(BLOCK=1024, USE_GDC=gdc, GDC_LATE=late)))
        ok.append(check(layer_ops_triton._qkv_rope_kernel, dict(QKV=bf16, sqkv=6144, QW=bf16, KW=bf16, COS=bf16, SIN=bf16,
                                                              scs=128, Q=bf16, KC=bf16, VC=bf16, sch=2048 * 128, scs_slot=128,
                                                              START=i64, T=17, n_q=32, n_kv=8, eps=1e-6,
                                                              scc=8 * 2048 * 128),
                        dict(HALF=64, HB=64, HAS_NORM=True, USE_GDC=gdc, GDC_LATE=late)))
        ok.append(check(layer_ops_triton._qkv_rope_tiles_kernel, dict(QKV=bf16, sqkv=6144, QW=bf16, KW=bf16, COS=bf16,
                                                                    SIN=bf16, scs=128, Q=bf16, KC=bf16, VC=bf16,
                                                                    sch=2048 * 128, scs_slot=128, START=i64, T=17, n_q=32,
                                                                    n_kv=8, eps=1e-6, scc=8 * 2048 * 128),
                        dict(HALF=64, HB=64, HG=layer_ops_triton.ROPE_HEADS, HAS_NORM=True, USE_GDC=gdc,
                             GDC_LATE=late)))

# the attention kernels with programmatic dependent launch's wait / launch_dependents (kernels/pdl.py)
if want("attention"):
    for late in (False, True):   # late: "pdl-late"'s launch after the main loop
        ok.append(check(attention_triton._live_attn_kernel,
                        dict(Q=bf16, K=bf16, V=bf16, BIAS=bf16, LIVE=i64, PREFIX=i64, O=bf16, PACC=f32, PM=f32, PL=f32, COUNT=i64,
                             M=4 * 17, T=17, G=4, n_split=3, scale=0.088, sqh=17 * 4 * 128, sqm=128, skh=2112 * 128, skn=128,
                             svh=2112 * 128, svn=128, sbm=2112, sbn=1, sot=4096, **LIVE_SLOTS),
                        dict(D=128, BLOCK_M=16, BLOCK_N=64, BLOCK_D=128, HAS_PREFIX=True, SPLIT=True, IEEE=False, FOLD=False,
                             USE_GDC=True, GDC_LATE=late)))
        ok.append(check(attention_triton._combine_kernel, dict(PACC=f32, PM=f32, PL=f32, O=bf16, LIVE=i64, M=4 * 17, T=17, G=4,
                                                             n_split=3, n_heads=8, sot=4096, **COMBINE_SLOTS),
                        dict(D=128, BLOCK_D=128, SP=4, T_MAJOR=True, USE_GDC=True, GDC_LATE=late)))
        ok.append(check(attention_triton._combine_kernel, dict(PACC=f32, PM=f32, PL=f32, O=bf16, LIVE=i64, M=4 * 129, T=129, G=4,
                                                             n_split=5, n_heads=8, sot=4096, **COMBINE_SLOTS),   # 16 rows (n = 128)
                        dict(D=128, BLOCK_D=128, SP=8, T_MAJOR=True, USE_GDC=late, GDC_LATE=late,
                             ROWS=attention_triton.COMBINE_ROWS)))
        ok.append(check(tree_attention_triton._tree_attn_kernel,
                        dict(Q=bf16, K=bf16, V=bf16, PATH=i64, POS=i64, PREFIX=i64, O=bf16, PACC=bf16, PM=bf16, PL=bf16, COUNT=i64,
                             M=4 * 257, T=257, G=4, n_split=1, qk_scale=0.127, sqh=257 * 128, skh=2112 * 128, skn=128,
                             svh=2112 * 128, svn=128, spath=16, sot=4096, **TREE_SLOTS),
                        dict(D=128, L1P=16, BLOCK_M=32, BLOCK_N=64, SPLIT=False, IEEE=False, K_ROWS=False, TREE_DENSE=True, FOLD=False,
                             USE_GDC=True, GDC_LATE=late)))
    # a batched verify's slotted launches (batch_forward.target_forward_batch: 16 slots of a 2112-slot slotted cache,
    # B = 16 on the live kernel, B = 64 on the tree kernel with config's shape and its ranges spread over the slots,
    # the combine over 16 x 8 partial heads): slot strides as the batched loop's cache views give them
    for T, kern in ((17, "live"), (65, "tree")):
        q_s, kv_s = 32 * T * 128, 8 * 2112 * 128
        if kern == "live":
            ok.append(check(attention_triton._live_attn_kernel,
                            dict(Q=bf16, K=bf16, V=bf16, BIAS=bf16, LIVE=i64, PREFIX=i64, O=bf16, PACC=f32, PM=f32, PL=f32,
                                 COUNT=i64, M=4 * T, T=T, G=4, n_split=2, scale=0.088, sqh=4 * T * 128, sqm=128,
                                 skh=2112 * 128, skn=128, svh=2112 * 128, svn=128, sbm=2112, sbn=1, sot=4096, n_kv=8,
                                 sqc=q_s, skc=kv_s, svc=kv_s, sbc=4 * T * 2112, soc=T * 4096),
                            dict(D=128, BLOCK_M=16, BLOCK_N=64, BLOCK_D=128, HAS_PREFIX=True, SPLIT=True, IEEE=False),
                            dict(num_warps=4, num_stages=2), mma=True))
        else:
            c = tree_attention_triton.config(4 * T, torch.bfloat16)
            ok.append(check(tree_attention_triton._tree_attn_kernel,
                            dict(Q=bf16, K=bf16, V=bf16, PATH=i64, POS=i64, PREFIX=i64, O=bf16, PACC=f32, PM=f32, PL=f32,
                                 COUNT=i64, M=4 * T, T=T, G=4, n_split=1, qk_scale=0.127, sqh=T * 128, skh=2112 * 128,
                                 skn=128, svh=2112 * 128, svn=128, spath=16, sot=4096, n_kv=8, sqc=q_s, skc=kv_s,
                                 svc=kv_s, spc=T * 16, soc=T * 4096, WORDS=i64, sw=-(-T // 64), swc=T * -(-T // 64)),
                            dict(D=128, L1P=16, BLOCK_M=c.block_m, BLOCK_N=c.block_n, SPLIT=True, IEEE=False,
                                 K_ROWS=c.k_rows, TREE_DENSE=c.tree_dense, VIS_WORDS=c.tree_dense),
                            dict(num_warps=c.warps, num_stages=c.stages), mma=True))
        ok.append(check(attention_triton._combine_kernel, dict(PACC=f32, PM=f32, PL=f32, O=bf16, LIVE=i64, M=4 * T, T=T, G=4,
                                                             n_split=2, n_heads=16 * 8, sot=4096, n_kv=8, soc=T * 4096),
                        dict(D=128, BLOCK_D=128, SP=2, T_MAJOR=kern == "tree")))


print(f"{sum(ok)} of {len(ok)} kernel compilations succeeded")
sys.exit(0 if all(ok) else 1)
