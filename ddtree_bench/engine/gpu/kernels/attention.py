"""Attention over the live cache slots only, as a Triton kernel whose length comes from a device tensor.

The fixed-shape forwards (forward.py) attend over a preallocated cache with an additive bias that
hides every slot past the frontier. `live_attend(q, k, v, bias, live, prefix)` computes the same
    out = softmax(q k^T / sqrt(D) + bias) v        (grouped-query: query head h uses KV head h // g)
as forward.grouped_attend (SDPA over every slot, its PyTorch twin), but reads only slots < `live`
(a 0-d device long tensor: start + T), so a CUDA graph captured once stays valid as the prefix grows
and the work scales with the live length, not the capacity. The caller guarantees that the bias
hides every slot >= live; with `prefix` (0-d device tensor) it also guarantees every slot < prefix
is visible to every row and that query row t (of T) sees no slot past prefix + t, and the kernel then
reads the bias only from `prefix` on and stops each row block at its last row's slot (the target's
verify: the committed prefix is visible, the tree part is the ancestor mask, and a node's ancestors
come before it in the tree's order).

Layout: the g query heads of a KV head are folded into one query axis of M = g*T rows, as
grouped_attend does. Few rows (AR, small trees) cannot fill the GPU with one program per
(KV head, row block), so the slots are split into `n_split` ranges (split-KV, as flash-decoding
does): each program keeps an online softmax (running max m, sum l, unnormalised acc) over its range
and a second launch, one program per (KV head, query row) with every range loaded at once, combines
them: m = max_s m_s, out = sum_s e^(m_s - m) acc_s / sum_s e^(m_s - m) l_s. (The first combine, one
program per row block looping over the ranges, measured 0.42 ms at n = 1 and 1.42 ms at n = 16 on the
8B shape, more than the attention itself; this one is not measured on a GPU yet.)
With "split-cap" (kernels/experimental.py: off until an H200 has timed it) the count pays for its
partials. They cost traffic: a range writes M rows of D fp32 (and the combine reads them back), so n_split
ranges of a KV head write n_split * M * D * 4 bytes against the 2 * live * D * 2 bytes of bf16 K/V the
head reads. The host sees only the capacity (the live length is on the device), so a launch whose
range count n_split chose caps it on the device, at the live length of each launch:
    ranges used r = clamp(live // M, 1, n_split)        (r * M <= live: partials <= bf16 K/V bytes)
and its ranges r .. n_split - 1 read and store nothing (the combine reads only the first r). On the 8B
shape (8 KV heads, 2048-slot cache, prefix 1024) that keeps AR's 32 ranges (M = 4) and takes n = 16
from 32 ranges to 16 (M = 64, live 1040) and n = 64 from 9 to 4 (M = 256, live 1088). A fixed
`splits` (tests, tuning) is used as given.
With "bf16-partials" (off: neutral on an H100, docs/gpu-performance.md; no H200 has timed it) each range's unnormalised acc is stored in the activation
dtype (bf16 / fp16; m and l stay fp32), halving that traffic as vLLM's paged attention v2 keeps its partial outputs
in the activation dtype; the combine still sums in fp32 (`partial_dtype`). It rounds each partial once more, so
outputs may move in their last bits.
With one range the first launch writes the output itself. With `fold` (one launch per layer), the
combine runs inside the same launch instead: each program of a (KV head, row block) stores its range's
partials and bumps that block's int32 counter (`counters`: one zeroed buffer per device, kept for the
process); the program that bumps it last reduces every range's partials for the block, writes the
output and sets the counter back to 0, so the next launch or CUDA-graph replay starts from zero. Two
folded launches must therefore not run at once on two streams of one device (they would share
counters). The output is written straight in the [T, Hq*D] layout o_proj takes.

Slot axis (the batched loop, batch_forward.py): q [C, Hq, T, D] against C regions k, v [C, Hkv, S, D] of a slotted
cache (views with any slot stride, e.g. a layer's `k[:, :C]`), bias [C, g*T, S], live / prefix [C] (each slot's
frontier): grid axis 0 runs over C * Hkv programs, slot c = program // Hkv, and every pointer first moves by its
slot's stride (runtime arguments, so a launch over C slots and one over a single slot compile the same variant;
the slot offset is 64-bit). Slot c reads only its own region below its own live[c]; the output is [C*T, Hq*D]
slot-major, partials [n_split, C*Hkv, M, BLOCK_D], and n_split counts programs over C * Hkv (more slots, fewer
ranges) except for two slots of a DFlash or small DDTree block (`split_pairs`). A call without the slot axis is
the C = 1 case: the grid, blocks and ranges it had before the axis.

Rounding: q k^T in fp32 (IEEE for fp32 inputs, not TF32), softmax statistics in fp32, the
probabilities cast to the value dtype before the P V product (as SDPA's fused kernels do). No
block size depends on the budget beyond M's power-of-two bucket (16/32/64/128 rows), and no
integer argument is specialised, so a new budget compiles nothing new. Knows nothing of models.
"""

from __future__ import annotations

import torch

from ddtree_bench.engine.gpu.kernels.common import _pow2, tl, triton
from ddtree_bench.engine.gpu.kernels.warm import launch
from ddtree_bench.engine.gpu.kernels import experimental, pdl

SM_TARGET = 264          # programs to aim for (two per SM of an H100/H200) when choosing n_split
# forward.py's auto choice takes this kernel up to this many query rows (g*T) and SDPA over every slot above:
# on an H200 (2026-12-01, 8B shape, 2048-slot cache) the kernel won up to 516 rows (n <= 128) and lost to
# SDPA's cuDNN flash kernel from 1028 rows (n >= 256) by 1.4x-2.5x in attention time (docs/gpu-performance.md)
AUTO_MAX_ROWS = 768
BLOCK_N = 64             # cache slots per inner step
STAGES = 2               # software pipeline stages in bf16 / fp16 (fp32: 1)
BLOCK_MS = (16, 32, 64, 128)   # query rows per program live_attend takes (tl.dot's least to two warpgroups)
NEG_BIG = -1.0e30        # running-max start: finite, so a range with nothing visible gives e^(..)=0, never NaN
# the split-KV combine as a second launch (False) or folded into the attention launch (True); which wins on an H200
# is what benchmarks/gpu_attention_tune.py measures (docs/gpu-performance.md)
FOLD = False
COMBINE_ROWS = 16        # query rows per combine program from COMBINE_ROWS_FROM folded rows (combine_rows)
COMBINE_ROWS_FROM = 256
COMBINE_ROW_WARPS = 1    # warps of a one-row combine program (combine): its sums stay inside one warp
COUNTERS_MIN = 4096      # int32 counters allocated at least (one per KV head x row block of a folded launch)
_COUNTERS: dict[str, list[torch.Tensor]] = {}


if triton is not None:

    @triton.jit
    def _last_of_block(COUNT, idx, n):
        """Bump counter idx after this program's partial stores; true in the program that bumps it n-th
        (the last of the n ranges of its row block to finish), which then sees every range's stores."""
        tl.debug_barrier()   # every thread's partial stores issued before the release below
        old = tl.atomic_add(COUNT + idx, 1, sem="acq_rel", scope="gpu")
        return old == n - 1

    @triton.jit
    def _ranges_used(live, M, n_split):
        """The ranges a capped launch uses: clamp(live // M, 1, n_split) (module docstring: partials <= K/V bytes)."""
        return tl.minimum(tl.maximum(live // M, 1), n_split)

    @triton.jit
    def _reduce_ranges(PACC, PM, PL, rows, rmask, M, n_heads, h, n_ranges,
                       BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
        """The n_ranges partials (m in natural-log units, l, acc) of `rows` of KV head h combined into the
        normalised output [BLOCK_M, BLOCK_D] (fp32); loads bypass L1 (.cg): other SMs wrote them."""
        dims = tl.arange(0, BLOCK_D)
        m = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)   # NEG_BIG
        l = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for s in range(0, n_ranges):
            base = (s * n_heads + h) * M + rows
            ms = tl.load(PM + base, mask=rmask, other=-1.0e30, cache_modifier=".cg")
            ls = tl.load(PL + base, mask=rmask, other=0.0, cache_modifier=".cg")
            a_s = tl.load(PACC + base[:, None] * BLOCK_D + dims[None, :], mask=rmask[:, None], other=0.0,
                          cache_modifier=".cg")
            m_new = tl.maximum(m, ms)
            alpha = tl.exp(m - m_new)
            w = tl.exp(ms - m_new)
            l = l * alpha + ls * w
            acc = acc * alpha[:, None] + a_s * w[:, None]
            m = m_new
        return acc / l[:, None]

    @triton.jit
    def _slot_of(n_kv):
        """(slot c, KV head h, program hh) of a program over axis 0 = C * n_kv (slot-major)."""
        hh = tl.program_id(0)
        c = hh // n_kv
        return c, hh - c * n_kv, hh

    @triton.jit(do_not_specialize=["M", "T", "n_split"])
    def _live_attn_kernel(Q, K, V, BIAS, LIVE, PREFIX, O, PACC, PM, PL, COUNT,
                          M, T, G, n_split, scale,
                          sqh, sqm, skh, skn, svh, svn, sbm, sbn, sot,
                          n_kv, sqc, skc, svc, sbc, soc,
                          D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                          HAS_PREFIX: tl.constexpr, SPLIT: tl.constexpr, IEEE: tl.constexpr,
                          FOLD: tl.constexpr = False, USE_GDC: tl.constexpr = False, CAP: tl.constexpr = False,
                          GDC_LATE: tl.constexpr = False):
        pdl.enter(USE_GDC, GDC_LATE)
        c, h, hh = _slot_of(n_kv)   # slot c's region: every pointer below moves by its slot stride first
        c64 = c.to(tl.int64)
        Q += c64 * sqc
        K += c64 * skc
        V += c64 * svc
        BIAS += c64 * sbc
        O += c64 * soc
        LIVE += c
        PREFIX += c
        pid_m = tl.program_id(1)
        s_id = tl.program_id(2)
        live = tl.load(LIVE).to(tl.int32)
        if CAP:   # ranges past the partials cap stay empty (lo >= live) and store nothing
            n_used = _ranges_used(live, M, n_split)
        else:
            n_used = n_split
        per = tl.cdiv(tl.cdiv(live, BLOCK_N), n_used) * BLOCK_N
        lo = s_id * per
        hi = tl.minimum(lo + per, live)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, BLOCK_D)
        rmask = rows < M
        dmask = dims < D
        q = tl.load(Q + h * sqh + rows[:, None] * sqm + dims[None, :], mask=rmask[:, None] & dmask[None, :], other=0.0)
        m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)   # NEG_BIG
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        if HAS_PREFIX:  # tree row t sees no slot past prefix + t: stop at the block's last row
            prefix = tl.load(PREFIX).to(tl.int32)
            t_last = tl.max(tl.where(rmask, rows % T, 0), axis=0)
            hi = tl.minimum(hi, prefix + t_last + 1)
        for n0 in range(lo, hi, BLOCK_N):
            cols = n0 + tl.arange(0, BLOCK_N)
            cmask = cols < hi
            k = tl.load(K + h * skh + cols[None, :] * skn + dims[:, None], mask=cmask[None, :] & dmask[:, None], other=0.0)
            if IEEE:
                s = tl.dot(q, k, input_precision="ieee") * scale
            else:
                s = tl.dot(q, k) * scale
            bmask = rmask[:, None] & cmask[None, :]
            if HAS_PREFIX:
                bmask = bmask & (cols >= prefix)[None, :]
            b = tl.load(BIAS + rows[:, None] * sbm + cols[None, :] * sbn, mask=bmask, other=0.0)
            s = tl.where(cmask[None, :], s + b.to(tl.float32), float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(V + h * svh + cols[:, None] * svn + dims[None, :], mask=cmask[:, None] & dmask[None, :], other=0.0)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        pdl.release(USE_GDC, GDC_LATE)
        if SPLIT:   # partials [n_split, C * n_kv, M, BLOCK_D]: program hh's rows
            base = (s_id * tl.num_programs(0) + hh) * M + rows
            smask = rows < tl.where(s_id < n_used, M, 0)   # a range past the cap stores nothing
            tl.store(PM + base, m_i, mask=smask)
            tl.store(PL + base, l_i, mask=smask)
            tl.store(PACC + base[:, None] * BLOCK_D + dims[None, :], acc, mask=smask[:, None])
            if FOLD:   # the last range of this row block to finish combines them all (module docstring)
                idx = hh * tl.num_programs(1) + pid_m
                if _last_of_block(COUNT, idx, n_split):
                    out = _reduce_ranges(PACC, PM, PL, rows, rmask, M, tl.num_programs(0), hh, n_used, BLOCK_M, BLOCK_D)
                    g = rows // T
                    t = rows - g * T
                    ptr = O + t[:, None] * sot + (h * G + g)[:, None] * D + dims[None, :]
                    tl.store(ptr, out.to(O.dtype.element_ty), mask=rmask[:, None] & dmask[None, :])
                    tl.store(COUNT + idx, 0)
        else:
            out = acc / l_i[:, None]
            g = rows // T
            t = rows - g * T
            ptr = O + t[:, None] * sot + (h * G + g)[:, None] * D + dims[None, :]
            tl.store(ptr, out.to(O.dtype.element_ty), mask=rmask[:, None] & dmask[None, :])

    @triton.jit(do_not_specialize=["M", "T", "n_split"])
    def _combine_kernel(PACC, PM, PL, O, LIVE, M, T, G, n_split, n_heads, sot, n_kv, soc,
                        D: tl.constexpr, BLOCK_D: tl.constexpr, SP: tl.constexpr, T_MAJOR: tl.constexpr = False,
                        USE_GDC: tl.constexpr = False, CAP: tl.constexpr = False, ROWS: tl.constexpr = 1,
                        GDC_LATE: tl.constexpr = False):
        """One program per (slot, KV head, ROWS query rows): every range's (m, l, acc) reduced (CAP: only the ranges
        the capped launch used, from the slot's LIVE). ROWS = 1 loads every range at once; ROWS > 1 loads the ranges'
        maxima at once, then weighs and sums each range's (l, acc) in range order. Rows fold (query head in the
        group, t) g-major (row = g*T + t), or t-major (row = t*G + g: tree_attention.py). n_heads = C * n_kv
        partial heads (slot-major); slot c's output starts soc elements in."""
        pdl.enter(USE_GDC, GDC_LATE)
        c, h, hh = _slot_of(n_kv)
        O += c.to(tl.int64) * soc
        LIVE += c
        rows = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
        rmask = rows < M
        sp = tl.arange(0, SP)
        if CAP:
            used = _ranges_used(tl.load(LIVE).to(tl.int32), M, n_split)
        else:
            used = n_split
        dims = tl.arange(0, BLOCK_D)
        if ROWS == 1:
            row = tl.program_id(1)
            smask = sp < used
            base = (sp * n_heads + hh) * M + row
            ms = tl.load(PM + base, mask=smask, other=-1.0e30)   # NEG_BIG: a range with nothing visible weighs 0
            ls = tl.load(PL + base, mask=smask, other=0.0)
            w = tl.exp(ms - tl.max(ms, axis=0))
            a = tl.load(PACC + base[:, None] * BLOCK_D + dims[None, :], mask=smask[:, None], other=0.0)
            out = (tl.sum(a * w[:, None], axis=0) / tl.sum(ls * w, axis=0))[None, :]
        else:
            mall = tl.load(PM + (sp[:, None] * n_heads + hh) * M + rows[None, :],
                           mask=(sp < used)[:, None] & rmask[None, :], other=-1.0e30)
            m = tl.max(mall, axis=0)
            acc = tl.zeros((ROWS, BLOCK_D), dtype=tl.float32)
            den = tl.zeros((ROWS,), dtype=tl.float32)
            for s in range(0, used):
                base = (s * n_heads + hh) * M + rows
                w = tl.exp(tl.load(PM + base, mask=rmask, other=-1.0e30) - m)
                den += tl.load(PL + base, mask=rmask, other=0.0) * w
                acc += tl.load(PACC + base[:, None] * BLOCK_D + dims[None, :], mask=rmask[:, None], other=0.0) * w[:, None]
            out = acc / tl.where(rmask, den, 1.0)[:, None]
        pdl.release(USE_GDC, GDC_LATE)
        if T_MAJOR:
            t = rows // G
            g = rows - t * G
        else:
            g = rows // T
            t = rows - g * T
        tl.store(O + t[:, None] * sot + (h * G + g)[:, None] * D + dims[None, :], out.to(O.dtype.element_ty),
                 mask=rmask[:, None] & (dims < D)[None, :])


def partial_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the split-KV partial sums (acc) for inputs of `dtype`: fp32, or the activation dtype itself
    under "bf16-partials" for bf16 / fp16 inputs (module docstring). m and l are always fp32."""
    if dtype in (torch.bfloat16, torch.float16) and experimental.enabled("bf16-partials"):
        return dtype
    return torch.float32


def combine_rows(M: int) -> int:
    """Query rows per program of the split-KV combine: COMBINE_ROWS from COMBINE_ROWS_FROM folded rows
    (DDTREE_COMBINE_ROWS_FROM in an A/B), else one. In one-process A/Bs on the H200 (docs/gpu-performance.md):
    16 rows were 1-6% slower at n <= 16 (2026-12-02, 04:00 UTC); with the tree kernel's 4 prefix ranges they took
    2.2-2.5% off the forward at n = 128 (M = 516: 4128 one-row programs) that morning, and 2.4% at n = 64 (M = 256:
    the combine 0.27 -> ~0.13 ms a forward) on 2026-12-03."""
    return COMBINE_ROWS if M >= experimental.knob("COMBINE_ROWS_FROM", COMBINE_ROWS_FROM) else 1


def combine(pacc, pm, pl, out, live, M: int, T: int, G: int, n_split: int, n_kv: int, t_major: bool = False,
            cap: bool = False):
    """The second launch of a split launch: out [C*T, Hq*D] (slot-major) from every range's partials
    (pacc [n_split, C*n_kv, M, BLOCK_D], pm / pl [n_split, C*n_kv, M]; live [C] or 0-d); shared by live_attend and
    tree_attention. A one-row program (below COMBINE_ROWS_FROM rows) runs as COMBINE_ROW_WARPS warp(s): its
    range-axis sums then need no shared-memory exchange between warps (verify 0.985-0.993x at n = 16-48 on an H100);
    16-row programs keep four (fewer bought nothing there; docs/gpu-performance.md, "2026-12-06 10:28-10:50 UTC")."""
    heads, BD = pacc.shape[1], pacc.shape[-1]
    rows = combine_rows(M)
    warps = experimental.knob("COMBINE_ROW_WARPS", COMBINE_ROW_WARPS, (1, 2, 4, 8)) if rows == 1 else 4
    launch(_combine_kernel, (heads, triton.cdiv(M, rows)), pacc, pm, pl, out, live, M, T, G, n_split, heads,
           out.shape[1], n_kv, T * out.shape[1],
           D=out.shape[1] // (n_kv * G), BLOCK_D=BD, SP=_pow2(n_split),
           T_MAJOR=t_major, CAP=cap, ROWS=rows, num_warps=warps,
           **pdl.gdc_options(out.device, out.shape[0]))


def wanted(q: torch.Tensor, k: torch.Tensor) -> bool:
    """auto's choice for q [Hq, T, D] against k [Hkv, S, D]: this kernel when it runs here and the folded
    query rows g*T are at most AUTO_MAX_ROWS."""
    return available(q.device) and (q.shape[0] // k.shape[0]) * q.shape[1] <= AUTO_MAX_ROWS


def available(device) -> bool:
    """The kernel can run here: Triton is installed and the device is CUDA (or the CPU interpreter in tests)."""
    import os

    dev = torch.device(device)
    return triton is not None and (dev.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")


def block_m(M: int) -> int:
    """Query rows per program: 16 (tl.dot's least) up to 128 rows, 32 up to 512, then 64 (128 from 1024 rows).
    Small row blocks leave more programs to split the slots over: on the H200 16 rows beat 64 at 64 rows (n = 16)
    and 32 beat 64 at 256 (docs/gpu-performance.md, "H200, 2026-12-02"); the edges sit between."""
    if M >= 1024:
        return 128
    return 16 if M <= 128 else 32 if M <= 512 else 64


SLOT_WIDE_ROWS = 64   # slot_rows: rows per program over SLOT_WIDE_FROM+ slots of more than this many folded rows (<= 128)
SLOT_WIDE_FROM = 4    # slots from which slot_rows takes SLOT_WIDE_ROWS


def slot_rows(M: int, C: int) -> int:
    """Query rows per program: block_m(M) for one slot and for two; over C >= SLOT_WIDE_FROM slots, SLOT_WIDE_ROWS for
    64 < M <= 128 (a DDTree B = 16 verify: 68 rows), where one slot's 16-row blocks leave ~5 programs per slot and
    head each walking the whole prefix. From H200 A/Bs (docs/gpu-performance.md, "The night before"): wide rows won at
    batch 16, tied at 4, lost at 2; AR (4 rows) and DFlash (64) lost with them at 16. DDTREE_SLOT_ROWS (one of
    BLOCK_MS) overrides the rule over 2+ slots for an A/B."""
    if C == 1:
        return block_m(M)
    wide = C >= SLOT_WIDE_FROM and SLOT_WIDE_ROWS < M <= 128
    return experimental.knob("SLOT_ROWS", SLOT_WIDE_ROWS if wide else block_m(M), BLOCK_MS)


def ranges_used(n_split: int, M: int, live: int) -> int:
    """The slot ranges a launch of n_split ranges (chosen by n_split) uses at `live` slots: the kernel's own
    cap (_ranges_used), clamp(live // M, 1, n_split), so the partials never outweigh the K/V they summarise
    (all n_split unless "split-cap" is on)."""
    return min(max(live // M, 1), n_split) if capped() else n_split


def capped() -> bool:
    """Whether n_split's ranges are capped at the live length ("split-cap", kernels/experimental.py; the module
    docstring): benchmarks/gpu_attention_tune.py times the capped counts beside the uncapped one."""
    return experimental.enabled("split-cap")


def counters(device, n: int) -> torch.Tensor:
    """At least n zeroed int32 counters on device for folded launches (the kernels set each back to 0 after use);
    a bigger request allocates a new buffer, and every buffer stays alive, since captured graphs keep its address."""
    bufs = _COUNTERS.setdefault(str(torch.device(device)), [])
    if not bufs or bufs[-1].numel() < n:
        bufs.append(torch.zeros(max(n, COUNTERS_MIN), dtype=torch.int32, device=device))
    return bufs[-1]


def n_split(n_heads: int, M: int, capacity: int, rows: int | None = None, slots: int = BLOCK_N) -> int:
    """Slot ranges per (KV head, row block of `rows`, default block_m(M)): 1 when the row blocks alone fill the
    GPU (SM_TARGET / 2 programs), else enough ranges for SM_TARGET programs, at most one per `slots` slots.
    live_attend's kernel then uses only ranges_used(n_split, M, live) of them (the partials cap)."""
    programs = n_heads * triton.cdiv(M, rows or block_m(M))
    if 2 * programs >= SM_TARGET:
        return 1
    return max(1, min(triton.cdiv(capacity, slots), triton.cdiv(SM_TARGET, programs)))


PAIR_ROWS = (64, 128)   # folded rows [lo, hi) over which two slots keep one slot's ranges each (split_pairs)


def split_pairs(C: int, Hkv: int, M: int) -> int:
    """The (slot, KV head) pairs n_split spreads its ranges over: C * Hkv, more slots fewer ranges, except two slots
    of PAIR_ROWS folded rows (a DFlash block, a DDTree verify below the tree kernel's rows), which keep one slot's
    ranges each: a range is 1/n_split of the live prefix, so halving the count doubled what each program walks, and
    this kernel's time is its longest program's walk. Then each slot also sums in the one-slot call's order. The
    edges are an H200 A/B's (benchmarks/gpu_slot_attention_ab.py, docs/gpu-performance.md): AR's 4 rows and 4+ slots
    lost or tied with it."""
    return Hkv if C == 2 and PAIR_ROWS[0] <= M < PAIR_ROWS[1] else C * Hkv


def live_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, live: torch.Tensor,
                prefix: torch.Tensor | None = None, splits: int | None = None, fold: bool | None = None,
                rows: int | None = None) -> torch.Tensor:
    """q: [Hq, T, D]; k, v: [Hkv, S, D] (slot stride free, last dim contiguous); bias: [g*T, S] additive,
    rows repeated per group; live: 0-d long, slots < live are read; prefix: 0-d long or None (see the
    module docstring). Returns [T, Hq*D] in q's dtype: forward.grouped_attend's result.
    With a leading slot axis (C regions of a slotted cache, batch_forward.py): q [C, Hq, T, D], k, v [C, Hkv, S, D]
    (any slot stride, e.g. a layer's `k[:, :C]`), bias [C, g*T, S], live / prefix [C]; slot c's rows attend over
    its own region with its own state, and the result is [C*T, Hq*D] slot-major. C = 1 is the call above.
    splits: fixed slot ranges, used as given (tests, tuning), else n_split's count over split_pairs' programs,
    capped on the device; fold: combine ranges in the same launch (default FOLD); rows: query rows per program, one
    of BLOCK_MS (tuning; else block_m(M); 8 warps from 128 rows, the two warpgroups Hopper's wgmma tiles want)."""
    if q.dim() == 3:   # one slot
        q, k, v, bias = q[None], k[None], v[None], bias[None]
    C, Hq, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    G = Hq // Hkv
    M = G * T
    q, live = q.contiguous(), live.contiguous()
    prefix = prefix.contiguous() if prefix is not None else None
    if k.stride(-1) != 1 or v.stride(-1) != 1 or bias.stride(-1) != 1:
        k, v, bias = k.contiguous(), v.contiguous(), bias.contiguous()
    out = torch.empty((C * T, Hq * D), dtype=q.dtype, device=q.device)
    if rows is not None and rows not in BLOCK_MS:
        raise ValueError(f"live_attend takes {BLOCK_MS} query rows per program, got {rows}")
    BM, BD = rows or slot_rows(M, C), max(16, _pow2(D))
    ns = n_split(split_pairs(C, Hkv, M), M, S, BM) if splits is None else splits
    cap = capped() and splits is None and ns > 1
    warps = 8 if BM >= 128 else 4
    bn = experimental.knob("LIVE_BLOCK_N", BLOCK_N, (16, 32, 64, 128))
    stages = 1 if q.dtype == torch.float32 else experimental.knob("LIVE_STAGES", STAGES, (1, 2, 3, 4))
    grid = (C * Hkv, triton.cdiv(M, BM), ns)
    if ns > 1:
        pacc = torch.empty((ns, C * Hkv, M, BD), dtype=partial_dtype(q.dtype), device=q.device)
        pm = torch.empty((ns, C * Hkv, M), dtype=torch.float32, device=q.device)
        pl = torch.empty_like(pm)
    else:
        pacc = pm = pl = out
    fold = (FOLD if fold is None else fold) and ns > 1
    count = counters(q.device, C * Hkv * grid[1]) if fold else live
    launch(_live_attn_kernel, grid, q, k, v, bias, live, prefix if prefix is not None else live, out, pacc, pm, pl,
           count, M, T, G, ns, D ** -0.5,
           T * D * G, D, k.stride(1), k.stride(2), v.stride(1), v.stride(2), bias.stride(1), 1, Hq * D,
           Hkv, q.stride(0), k.stride(0), v.stride(0), bias.stride(0), T * Hq * D,
           D=D, BLOCK_M=BM, BLOCK_N=bn, BLOCK_D=BD, HAS_PREFIX=prefix is not None, SPLIT=ns > 1,
           IEEE=q.dtype == torch.float32, FOLD=fold, CAP=cap, num_warps=warps,
           num_stages=stages, **pdl.gdc_options(q.device, out.shape[0]))
    if ns > 1 and not fold:
        combine(pacc, pm, pl, out, live, M, T, G, ns, Hkv, cap=cap)
    return out
