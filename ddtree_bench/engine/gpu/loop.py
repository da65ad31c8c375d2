"""The fast generation loop: fixed shapes, preallocated buffers, CUDA graphs, one host sync a round.

Same contract and same tokens as the reference loop (`generate.PlainLoop`; `Engine(cuda_graphs=True)`
runs this one), organised for a GPU:
* persistent state lives in device buffers: the frontier `start` and the drafter's `ctx_start` (0-d
  tensors), the bonus token, the context features of the last accepted path (`ctx`, block_size
  rows, padded), the draft logits [L, V];
* a round is six stages - draft, tree build, tree compile, verify, walk, commit - each a fixed-shape
  function of those buffers (forward.py, tree_ops.py), captured once per (method, budget) as a
  CUDA graph and replayed (graphs.py); the draft graph is shared by all budgets;
* the only host sync is waiting for the walk's small result vector (accepted count, path, tokens,
  bonus) to reach pinned host memory. The commit (KV compaction, context gather, frontier update)
  reads the walk result on the device, so it is queued before that wait, and so is the next round's
  draft (it reads only device state): while the host reads the result and queues the rest of the
  next round, the GPU is busy drafting, instead of idling for the host (docs/gpu-performance.md).
  Only after queuing are the tokens handed to the caller, so streaming callbacks overlap
  the GPU too. The draft is queued ahead whenever another round may follow, so a generation's
  last round usually leaves one unneeded draft behind: its tokens are out (t_done_ns is taken
  before it) and generate() returns once it has run (reading the stage times waits for the last
  event); with a pruned builder it is never queued after round 1 (see below);
* AR has no draft to queue ahead and queues one round at a time here: its host work between rounds is a few
  list operations (a 0.2% gap on the H200), while a round queued ahead would run for nothing after every stop
  token and hold up the next request's prefill (the batched loop keeps two AR rounds in flight from two
  requests up, where one request's stop wastes only its rows: batch_loop.py). Walk results land in a ring of
  pinned buffers (ResultRing) that the batched loop's solo rounds share;
* stage times come from CUDA events between the stages (no syncs), or perf_counter on a CPU.

On CUDA with Triton the layers' elementwise work runs as fused kernels (fused.py) and the tree
build uses the exact builder builders.py's per-budget rule names (one Triton block, ~30 small Triton
grids with or without precomputed keys; PyTorch if its check fails), checked once per budget. The Triton ones prune candidates; their rare certificate failure comes back with
the walk result. The commit already queued sees the flag on the device and leaves every state
buffer as it was, so the draft queued ahead recomputes this round's draft logits (same inputs,
same slots written), the round is redone with the exact PyTorch builder, and only that is
committed. Round 1 drafts eagerly from the whole prompt, not from the context buffer, so no draft
is queued ahead of its result; prefill is the plain Target.forward.
A proposer other than the DFlash drafter (tests rig one) drafts eagerly every round.
On a CPU the same fixed-shape code runs without capture, which is how CI checks it.
`rounds` holds the per-round stage times (ms) of the last generate, for bench-engine.
Knows nothing of HTTP, text or files.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ddtree_bench.engine.gpu import builders
from ddtree_bench.engine.gpu.forward import StaticKV, draft_forward, draft_visible, group_size, target_forward, visible_bias
from ddtree_bench.engine.gpu.fused import merge_projections, ops_for
from ddtree_bench.engine.gpu.graphs import Pool, Stage
from ddtree_bench.engine.gpu.tree_ops import ancestors, chain, commit_static, verify_visible, walk_static
from ddtree_bench.engine.interface import (ROUND_STAGES, Generation, OutputStream, RoundTrace, WalkLayout, logit_gaps,  # noqa: F401
                                          wants_round)
from ddtree_bench.engine.proposer import DFlashProposer
from ddtree_bench.engine.tree_vector import tree_nodes
from ddtree_bench.engine.verify import GREEDY_EPS, pick, request_generator

CAPACITY_ALIGN = 64  # cache slots; keeps the attention bias rows aligned for fused SDPA kernels
SPENT_EVENTS_MAX = 4096  # CUDA events a loop keeps for reuse (Laps.pool): a long generation's marks
WARM_ROUND = True   # FastLoop._warm_round compiles a new bucket's round at once (off: nothing; for cold-start A/Bs)
COLD_NOTICE_S = 1.0  # a new shape's first round slower than this on a GPU says why on stderr (cold_notice)


def cold_notice(what: str, seconds: float, device) -> None:
    """Tell the user why a new budget's first round was slow - Triton compiling and CUDA graphs capturing - on
    stderr above any progress bar (a sweep's first point of each budget, a server's first request), on CUDA
    when it took COLD_NOTICE_S or more."""
    if torch.device(device).type != "cuda" or seconds < COLD_NOTICE_S:
        return
    import sys

    from tqdm.auto import tqdm

    tqdm.write(f"[ddtree-bench] {what}: first round {seconds:.1f} s, compiling and capturing its GPU kernels (once per "
               "shape and process; a later run reuses the compiled kernels from the Triton cache)", file=sys.stderr)


_STREAMS: dict[tuple, Any] = {}   # (stream id, device index, device type) -> its torch.cuda.Stream (stream_now)


def stream_now(device: torch.device):
    """torch.cuda.current_stream(device), without its per-call checks (is CUDA available, which device): the
    runtime's current stream is asked each time (a stream context still counts), its Stream object built once.
    Events are recorded on it every round, where the host's microseconds show on small models."""
    key = torch._C._cuda_getCurrentStream(device.index if device.index is not None else torch.cuda.current_device())
    s = _STREAMS.get(key)
    if s is None:
        s = _STREAMS[key] = torch.cuda.Stream(stream_id=key[0], device_index=key[1], device_type=key[2])
    return s


class Laps:
    """Stage boundaries of a generation: CUDA events recorded on the stream current when the Laps was made (looked
    up once, stream_now, not at every mark), or perf_counter on a CPU. `rounds()` reads them once and gives the
    events back to `pool` (a loop's list of spent events, shared by its Laps), so a loop's rounds reuse events
    instead of making new ones. The marks are host work on every round's critical path where the host is the
    bottleneck (small models: docs/gpu-performance.md)."""

    def __init__(self, device: torch.device, pool: list | None = None):
        self.cuda = device.type == "cuda"
        self.stream = stream_now(device) if self.cuda else None
        self.pool = pool if pool is not None else []
        self.marks: list[tuple[str, Any]] = []
        self.handed_on = False   # its last mark also began another Laps, which gives that event back to the pool

    def begin(self, after: "Laps | None" = None) -> None:
        """The 'begin' mark: `after`'s last mark when the caller knows nothing was queued on the stream since it (one
        record fewer; that Laps no longer gives its last event back), else a new mark; a new mark too when `after`
        has none left (read already) or handed its last one on before."""
        if after is not None and after.marks and not after.handed_on:
            self.marks.append(("begin", after.marks[-1][1]))
            after.handed_on = True
        else:
            self.mark("begin")

    def mark(self, name: str) -> None:
        if self.cuda:
            ev = self.pool.pop() if self.pool else torch.cuda.Event(enable_timing=True)
            ev.record(self.stream)
            self.marks.append((name, ev))
        else:
            self.marks.append((name, time.perf_counter_ns()))

    def rounds(self) -> list[dict[str, float]]:
        """Per round (a round ends at its 'commit' mark): stage -> ms since the previous mark. Reads the marks once:
        they are cleared (their events back in the pool), so a second call returns []."""
        if self.cuda and self.marks:
            self.marks[-1][1].synchronize()
        out: list[dict[str, float]] = []
        cur: dict[str, float] = {}
        for (_, a), (name, b) in zip(self.marks, self.marks[1:]):
            ms = a.elapsed_time(b) if self.cuda else (b - a) / 1e6
            cur[name] = cur.get(name, 0.0) + ms
            if name == "commit":
                out.append(cur)
                cur = {}
        if self.cuda:
            mine = self.marks[:-1] if self.handed_on else self.marks
            self.pool.extend(ev for _, ev in mine[: max(0, SPENT_EVENTS_MAX - len(self.pool))])
        self.marks = []
        return out


@dataclass
class Ticket:
    """One round's walk result on its way to the host: a pinned buffer and the event recorded after its copy."""

    host: torch.Tensor
    ready: Any   # CUDA event, None on a CPU

    def take(self) -> list[int]:
        """Wait for this round's copy (not for the stages queued after it) and read it."""
        if self.ready is not None:
            self.ready.synchronize()
        return self.host.tolist()


class ResultRing:
    """Pinned host buffers for walk results, used in turn: a round queued while the host has not yet read the one
    before it (the batched loop's AR rounds) copies into the other buffer. A ticket stays valid until DEPTH more
    rounds have been put, so no more than DEPTH rounds may be in flight."""

    DEPTH = 2

    def __init__(self, n: int, device: torch.device):
        cuda = device.type == "cuda"
        self.device = device
        self.bufs = [torch.zeros(n, dtype=torch.long, pin_memory=cuda) for _ in range(self.DEPTH)]
        self.events = [torch.cuda.Event() if cuda else None for _ in range(self.DEPTH)]
        self.turn = 0

    def put(self, result: torch.Tensor) -> Ticket:
        """Queue the copy of `result` (flattened) to the next buffer and record its event."""
        i = self.turn % self.DEPTH
        self.turn += 1
        flat = result.reshape(-1)
        host = self.bufs[i][: flat.numel()]
        host.copy_(flat, non_blocking=True)
        if self.events[i] is not None:
            self.events[i].record(stream_now(self.device))
        return Ticket(host, self.events[i])


@dataclass
class TreeOut:
    """tree_build's output: the non-root nodes in pop order, parents 1-based (0 = root)."""

    tok: torch.Tensor   # [N] long
    par: torch.Tensor   # [N] long
    dep: torch.Tensor   # [N] long, 1..L


@dataclass
class Compiled:
    """tree_compile's output: the verify inputs."""

    ids: torch.Tensor            # [T] long, root (bonus) first
    pos: torch.Tensor            # [T] long, start + depth
    anc: torch.Tensor            # [T, T] bool ancestor-or-self
    bias: torch.Tensor           # [g*T, capacity] additive attention bias
    path: torch.Tensor | None    # [T, L+1] node at each depth (the fused Triton compile), else None


@dataclass
class Verified:
    """verify's output: the target's logits [T, V] and (speculative methods) the context features [T, C]."""

    logits: torch.Tensor
    hidden: torch.Tensor | None = None


@dataclass
class StageOutputs:
    """The latest output of each stage of a bucket, read by the next stage's function (inside a graph:
    the captured static tensors)."""

    tree: TreeOut | None = None
    compiled: Compiled | None = None
    verified: Verified | None = None
    walked: torch.Tensor | None = None   # the walk result (interface.WalkLayout; AR: the pick [1])

    _FIELD = {"tree_build": "tree", "tree_compile": "compiled", "verify": "verified", "walk": "walked"}

    def store(self, stage: str, value) -> None:
        if stage in self._FIELD:
            setattr(self, self._FIELD[stage], value)

    def clear(self) -> None:
        self.tree = self.compiled = self.verified = self.walked = None


@dataclass
class HostState:
    """What the host knows between rounds (the device holds the same in its buffers): the frontier
    `start` (the bonus's position), the drafter's frontier `draft_len`, the bonus token, the accepted
    count `a` of the last round (live rows of the context buffer), and the prefill's hidden states
    (round 1's context)."""

    prefill_hidden: torch.Tensor | None
    bonus: int
    start: int
    draft_len: int = 0
    a: int = 0


@dataclass
class Suspended:
    """A generation between two rounds: its last round read, committed and emitted, nothing of the next queued (a
    draft queued ahead may still run; it reads and writes only this generation's buffers and is recomputed by whoever
    goes on). `FastLoop.generate` / `resume` return one when their `yield_to` says so, and `resume` goes on from one.
    What the batched loop needs to go on with the request in the slot whose buffers it ran on (and what it hands
    back): the host state, the output stream, the generator, and what the rounds so far recorded (stage_ns: the
    prefill and the rounds' folded stage times, as a Generation's; the last run's own stage times are in
    FastLoop.rounds, as after a whole generation)."""

    host: HostState
    stream: OutputStream
    gen: torch.Generator | None
    accept_lengths: list[int]
    trees: list[RoundTrace] | None
    gaps: list[float]
    stage_ns: dict[str, int]
    t_start_ns: int
    t_first_token_ns: int


@dataclass(frozen=True)
class Ask:
    """What a request asks of its rounds, fixed from its first round to its last: `generate` makes it, `resume` is
    given its fields back (a batched request's), and `_rounds_of` reads it."""

    method: str
    budget: int
    max_new_tokens: int
    temperature: float
    top_p: float
    return_logit_gaps: bool
    num_prompt_tokens: int


FOLD = {"draft": "draft", "tree_build": "tree_build", "tree_compile": "tree_build", "verify": "verify",
        "walk": "commit", "commit": "commit"}   # round stages -> interface.STAGES


def stage_totals(prefill_ns: int, rounds: list[dict[str, float]]) -> dict[str, int]:
    """A generation's stage_ns (interface.STAGES) from its prefill ns and its rounds' stage ms (FOLD)."""
    totals = {"prefill": prefill_ns, "draft": 0, "tree_build": 0, "verify": 0, "commit": 0}
    for stage_ms in rounds:
        for k, ms in stage_ms.items():
            totals[FOLD[k]] += int(ms * 1e6)
    return totals


@dataclass
class _Bucket:
    """The stages and buffers of one (method, budget, greedy) combination."""

    method: str
    width: int                      # verify tokens: 1 + nodes
    stages: dict[str, Stage] = field(default_factory=dict)
    out: StageOutputs = field(default_factory=StageOutputs)
    layout: WalkLayout | None = None                   # the walk result's layout (speculative methods)
    post: torch.Tensor | None = None                   # sampled picks (temperature > 0)
    ring: ResultRing | None = None                     # pinned copies of the walk results
    last: Ticket | None = None                         # ... of the round queued last
    builder: Any = None                                # the tree builder (DDTree)
    fallback: "_Bucket | None" = None                  # exact PyTorch-builder twin, when the builder can flag


class FastLoop:
    def __init__(self, target, proposer=None, graphs: bool = True, capacity: int = 0, tree_kernel: str = "auto",
                 layer_ops: str = "auto"):
        self.target = target
        self.proposer = proposer
        self.drafter = proposer.drafter if isinstance(proposer, DFlashProposer) else None
        self.device = target.lm_head.weight.device
        self.dtype = target.lm_head.weight.dtype
        self.graphs = graphs and self.device.type == "cuda"
        self.tree_kernel = tree_kernel  # auto (builders.auto_kernel's rule on CUDA) | block | grid | grid-keys | torch
        self.builder_ms: dict[int, dict[str, float]] = {}  # budget -> auto's chosen builder -> ms per build
        self.layer_ops = layer_ops      # auto (fused Triton ops on CUDA when they pass their self-test) | triton | torch
        self.redone_rounds = 0          # rounds rebuilt with the exact builder after a failed certificate
        self.cold_s: dict[tuple[str, int], float] = {}   # (method, budget) -> s from its new bucket to its first result
        self.capacity = 0
        self.rounds: list[dict[str, float]] = []
        self.spent_events: list = []    # CUDA events read and free for the next Laps (Laps.pool)
        self._min_capacity = capacity
        self._warmed_rows: set[int] = set()   # row counts whose weight-GEMM variants are compiled
        self._builders: dict[tuple[int, str], Any] = {}
        for m in (target, self.drafter):   # before any capture: the merge allocates
            if m is not None:
                merge_projections(m)
        if capacity:
            self._ensure(capacity)

    # ------------------------------------------------------------------ buffers and buckets

    def release(self) -> None:
        """Free every captured graph now (stages are freed by Python's cyclic collector otherwise)."""
        for b in getattr(self, "buckets", {}).values():
            for stage in b.stages.values():
                stage.release()
            b.out.clear()
        if getattr(self, "draft_stage", None) is not None:
            self.draft_stage.release()

    @property
    def ops(self):
        """The layer ops of the static forwards (fused.ops_for caches its self-test)."""
        return ops_for(self.device, self.dtype, self.layer_ops)

    def tree_builder(self, budget: int) -> str | None:
        """Name of the tree builder DDTree at this budget uses (None before its first generate)."""
        b = self._builders.get((budget, self.tree_kernel))
        return None if b is None else b.name

    def supports(self, method: str, budget: int) -> bool:
        return method in ("ar", "dflash") or budget > 0

    def _ensure(self, capacity: int) -> None:
        cap = -(-max(capacity, self._min_capacity) // CAPACITY_ALIGN) * CAPACITY_ALIGN
        if cap <= self.capacity:
            return
        dev, t = self.device, self.target
        self.release()
        self.buckets: dict[tuple, _Bucket] = {}
        self.draft_stage: Stage | None = None
        self.tcache = self.tkv = self.dcache = self.dkv = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        long = dict(dtype=torch.long, device=dev)
        dcache = dlogits = ctx = None
        tcache = t.new_cache(cap)
        if self.proposer is not None:
            bs = self.proposer.block_size
            dcache = self.proposer.new_cache(cap)
            dlogits = torch.zeros(bs - 1, t.cfg.vocab_size, dtype=self.dtype, device=dev)
            ctx = torch.zeros(bs, len(self.proposer.target_layer_ids) * t.cfg.hidden_size, dtype=self.dtype, device=dev)
        self.adopt(cap, tcache, torch.zeros((), **long), torch.zeros((), **long), torch.zeros(1, **long), dcache, dlogits, ctx)

    def adopt(self, capacity: int, tcache, start: torch.Tensor, ctx_start: torch.Tensor, bonus: torch.Tensor,
              dcache=None, dlogits: torch.Tensor | None = None, ctx: torch.Tensor | None = None) -> None:
        """Run the stages on these state buffers: the target cache (a KVCache, or any object with k, v
        [layers, Hkv, S, D] whose layers are each contiguous), the frontier `start` and `ctx_start` (0-d),
        the bonus [1], and with a drafter its cache, draft logits [L, V] and context rows [L+1, C].
        _ensure adopts the buffers it allocates; the batched loop (batch_loop.py) adopts views of its slot 0,
        so that a bucket of one request runs this loop's stages on them. Drops every captured graph (they
        point at the old buffers); the checked tree builders stay."""
        dev = self.device
        self.release()
        self.buckets = {}
        self.draft_stage = None
        self.capacity = capacity
        self.tcache, self.tkv = tcache, StaticKV(tcache)
        self.start, self.ctx_start, self.bonus = start, ctx_start, bonus
        self.tgroup = group_size(self.target)
        if self.proposer is not None:
            self.L = self.proposer.block_size - 1
            self.dcache, self.dlogits, self.ctx = dcache, dlogits, ctx
        if self.drafter is not None:
            self.dkv = StaticKV(dcache)
            self.dgroup = group_size(self.drafter)
            self.mask_tail = torch.full((self.drafter.block_size - 1,), self.drafter.mask_token_id, dtype=torch.long, device=dev)
            kinds = [(c, w) for c, w in zip(self.drafter.cfg.layer_causal, self.drafter.cfg.layer_window)]
            self.draft_kind = [kinds.index(k) for k in kinds]   # layers with equal masks share one bias
            self.draft_pool = Pool(dev)

    def _draft(self, ctx: torch.Tensor) -> None:
        """DFlash draft of [bonus, mask...] at `start` with context rows `ctx` from `ctx_start`: -> dlogits."""
        d, bs = self.drafter, self.drafter.block_size
        block = torch.cat([self.bonus, self.mask_tail])
        emb = self.target.embed(block)
        made: dict[int, torch.Tensor] = {}
        biases = []
        for i, k in enumerate(self.draft_kind):
            if k not in made:
                made[k] = visible_bias(draft_visible(d, i, self.start, bs, self.capacity), self.dtype, self.dgroup)
            biases.append(made[k])
        h = draft_forward(d, ctx, emb, self.dkv, self.ctx_start, self.start, biases, self.ops)
        self.dlogits.copy_(self.ops.linear(h[1:], self.target.lm_head.weight, self.target.lm_head.bias))

    def _warm_linears(self, rows: int | None) -> None:
        """Compile the weight GEMMs a verify of `rows` tokens (and, first time, the draft block) will launch,
        all at once (fused.warm_linears), before the stages capture them one after another."""
        from ddtree_bench.engine.gpu.fused import warm_linears

        if self.device.type != "cuda":
            return
        block = self.proposer.block_size if self.proposer is not None else None   # the draft's rows; its logits' one fewer
        want = {r for r in (rows, block, block and block - 1) if r}
        want -= self._warmed_rows
        if want:
            models = [self.target] + ([self.drafter] if self.drafter is not None else [])
            warm_linears(models, self.ops, sorted(want), self.device)
            self._warmed_rows |= want

    def _warm_round(self, method: str, width: int, greedy: bool, guard: bool, ctx_rows: int | None = None) -> None:
        """Compile at once (kernels/warm.py, a thread per variant) the Triton kernels a first round of `width` verify
        tokens launches besides its tree build and weight GEMMs (warmed apart): round 1's eager draft from `ctx_rows`
        prompt rows and the captured draft from the context buffer, the tree compile, the verify forward's layer ops
        and attention, the walk (its argmax too) and the commit (guard: the walk result carries a certificate flag, as
        with a Triton builder) - beside each other, and for a new budget beside its builder (builders.prefetched),
        rather than one after another as the first round reaches them. The stage functions run recording (nothing
        launched) on a stand-in tree of width - 1 nodes; their one real write, the draft logits, is put back. AR's
        commit (PyTorch, mutating) is left out. CUDA with the fused ops only; nothing with WARM_ROUND off."""
        if not (WARM_ROUND and self._fused_round()):
            return
        from ddtree_bench.engine.gpu.kernels.warm import warm

        b = _Bucket(method, width)   # a throwaway: nothing reads its outputs
        long = dict(dtype=torch.long, device=self.device)
        if not greedy:
            b.post = torch.zeros(width, **long)

        def one_round() -> None:
            if method == "ar":
                b.out.store("verify", self._verify_ar())
                self._walk_ar(b, greedy)
                return
            if self.drafter is not None:
                self._draft(self.ctx)
                if ctx_rows and ctx_rows != self.ctx.shape[0]:   # a long prompt stands in as 4096 + its rows mod 16:
                    rows = min(ctx_rows, 4096 + ctx_rows % 16)      # Triton keys row counts by == 1 and % 16 only
                    self._draft(torch.zeros(rows, self.ctx.shape[1], dtype=self.ctx.dtype, device=self.device))
            n = width - 1
            b.out.store("tree_build", TreeOut(torch.zeros(n, **long), torch.zeros(n, **long), torch.ones(n, **long)))
            b.layout = WalkLayout(self.L, guard=guard)
            b.out.store("tree_compile", self._compile(b))
            b.out.compiled.ids.zero_()   # recorded, not computed: the embedding and RoPE gather at them
            b.out.compiled.pos.fill_(0)
            b.out.store("verify", self._verify_tree(b))
            b.out.store("walk", self._walk_tree(b, greedy))
            self._commit_tree(b)

        saved = self.dlogits.clone() if method != "ar" and self.proposer is not None else None   # AR: no draft
        warm(one_round, self.device, per="variant")
        if saved is not None:
            self.dlogits.copy_(saved)

    def _fused_round(self) -> bool:
        """A round here runs Triton kernels for its layer ops, GEMMs and tree ops (CUDA, both self-tests passed)."""
        return self.device.type == "cuda" and self.fused_tree_ops and hasattr(self.ops, "gemm_config")

    def _self_tests(self) -> None:
        """The layer ops' and the tree kernels' self-tests (each once a process, compiling its kernels first): run
        here, while a new budget's tree builder compiles on builders.prefetched's thread, rather than later."""
        self.ops
        self.fused_tree_ops

    def _builder(self, budget: int, kind: str):
        """The tree builder for a budget (builders.choose: auto compiles and checks the one Triton builder
        its rule names, torch if that fails); the chosen builder's ms per build lands in builder_ms."""
        choice = builders.choose(self.L, self.target.cfg.vocab_size, budget, self.device, self.dtype, kind)
        if choice.times_ms:
            self.builder_ms[budget] = choice.times_ms
        return choice.builder

    def _bucket(self, method: str, budget: int, greedy: bool, kind: str | None = None, graphs: bool | None = None,
                ctx_rows: int | None = None) -> _Bucket:
        """The bucket of (method, budget, greedy, kind, graphs), made at its first use: a new budget's tree builder
        checked (compiling beside the self-tests and warms: builders.prefetched), the GEMMs and the round's other
        kernels compiled at once (_warm_linears, _warm_round; ctx_rows: the prompt rows round 1 drafts from), the
        stages set up to capture at their first run."""
        kind = self.tree_kernel if kind is None else kind
        g = self.graphs if graphs is None else graphs
        key = (method, budget if method == "ddtree" else 0, greedy, kind, g)
        if key in self.buckets:
            return self.buckets[key]
        dev = self.device
        pool = Pool(dev)
        if method == "ar":
            self._warm_linears(1)
            self._warm_round("ar", 1, greedy, False)
            b = _Bucket("ar", 1)
            b.stages["verify"] = Stage(lambda: self._verify_ar(), dev, pool, g, name="verify")
            b.stages["walk"] = Stage(lambda: self._walk_ar(b, greedy), dev, pool, g, name="walk")
            b.stages["commit"] = Stage(lambda: self._commit_ar(b), dev, pool, g, idempotent=False, name="commit")
        else:
            L = self.L
            if method == "dflash":
                width = 1 + L
                build = lambda: TreeOut(*chain(self.dlogits))  # noqa: E731
            else:
                if (budget, kind) not in self._builders:  # builders outlive cache growth: no re-check, re-timing
                    V = self.target.cfg.vocab_size
                    rows = 1 + tree_nodes(L, V, budget)   # the verify's width, as the builder will report it
                    with builders.prefetched(L, V, budget, dev, self.dtype, kind):   # compiling meanwhile
                        self._self_tests()
                        self._warm_linears(rows)
                        self._warm_round(method, rows, greedy, kind != "torch", ctx_rows)
                    self._builders[(budget, kind)] = self._builder(budget, kind)
                builder = self._builders[(budget, kind)]
                width = 1 + builder.N
                build = lambda: TreeOut(*builder(self.dlogits))  # noqa: E731
            self._warm_linears(width)
            if method == "dflash":
                self._warm_round(method, width, greedy, False, ctx_rows)
            b = _Bucket(method, width)
            if method == "ddtree":
                b.builder = builder
                if hasattr(builder, "flag"):
                    b.fallback = self._bucket(method, budget, greedy, kind="torch", graphs=False)
            b.stages["tree_build"] = Stage(build, dev, pool, g, name="tree_build")
            b.stages["tree_compile"] = Stage(lambda: self._compile(b), dev, pool, g, name="tree_compile")
            b.stages["verify"] = Stage(lambda: self._verify_tree(b), dev, pool, g, name="verify")
            b.stages["walk"] = Stage(lambda: self._walk_tree(b, greedy), dev, pool, g, name="walk")
            b.stages["commit"] = Stage(lambda: self._commit_tree(b), dev, pool, g, idempotent=False, name="commit")
        if not greedy:
            b.post = torch.zeros(b.width, dtype=torch.long, device=dev)
        if method != "ar":
            b.layout = WalkLayout(self.L, guard=b.fallback is not None)
        n = 1 if method == "ar" else b.layout.size_guarded
        b.ring = ResultRing(n, dev)
        self.buckets[key] = b
        return b

    # ------------------------------------------------------------------ stage functions

    @property
    def fused_tree_ops(self) -> bool:
        """Tree compile and walk as one Triton launch each (kernels/tree_verify.py) - unless tree_kernel is torch."""
        from ddtree_bench.engine.gpu import tree_kernels

        return self.tree_kernel != "torch" and tree_kernels.available(self.device)

    def _compile(self, b: _Bucket) -> Compiled:
        t = b.out.tree
        if self.fused_tree_ops:
            from ddtree_bench.engine.gpu.kernels.tree_verify import compile_tree

            return Compiled(*compile_tree(self.bonus, t.tok, t.par, t.dep, self.start, self.capacity, self.dtype,
                                          self.tgroup, self.L))
        ids = torch.cat([self.bonus, t.tok])
        pos = self.start + torch.cat([torch.zeros(1, dtype=torch.long, device=t.dep.device), t.dep])
        anc = ancestors(t.par, self.L)
        bias = visible_bias(verify_visible(anc, self.start, self.capacity), self.dtype, self.tgroup)
        return Compiled(ids, pos, anc, bias, None)

    def _verify_tree(self, b: _Bucket) -> Verified:
        c = b.out.compiled
        layers = self.proposer.target_layer_ids
        return Verified(*target_forward(self.target, c.ids, c.pos, self.tkv, self.start, c.bias, layers, self.ops,
                                        tree_path=c.path))

    def _walk_tree(self, b: _Bucket, greedy: bool):
        t, c = b.out.tree, b.out.compiled
        post = self._argmax(b.out.verified.logits) if greedy else b.post
        if c.path is not None:
            from ddtree_bench.engine.gpu.kernels.tree_verify import walk_tree

            walked = walk_tree(c.ids, t.par, t.dep, c.path, post, b.layout)
        else:
            walked = walk_static(c.ids, t.par, t.dep, c.anc, post, self.L)
        if b.fallback is not None:  # the builder's certificate flag rides along with the one transfer
            walked = torch.cat([walked, b.builder.flag.to(torch.long)])
        return walked

    def _commit_tree(self, b: _Bucket) -> None:
        """Keep the accepted path (tree_ops.commit_static, or its Triton twin kernels/tree_verify.commit_tree): K/V moved
        to slots start..start+a-1, hidden rows as the next draft's context, frontier advanced, bonus
        stored. With a pruned builder the walk result ends with its certificate flag, and a raised flag
        makes the whole commit a no-op, so it can be queued before the host has read it."""
        if self.fused_tree_ops:
            from ddtree_bench.engine.gpu.kernels.tree_verify import commit_tree as commit
        else:
            commit = commit_static
        commit(b.out.walked, b.layout, self.start, self.ctx_start, self.bonus, self.tcache.k, self.tcache.v,
               b.out.verified.hidden, self.ctx)

    def _verify_ar(self) -> Verified:
        cols = torch.arange(self.capacity, device=self.device)
        bias = visible_bias((cols <= self.start)[None, :], self.dtype, self.tgroup)
        logits, _ = target_forward(self.target, self.bonus, self.start.reshape(1), self.tkv, self.start, bias, ops=self.ops)
        return Verified(logits)

    def _walk_ar(self, b: _Bucket, greedy: bool):
        return self._argmax(b.out.verified.logits) if greedy else b.post

    def _argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """The target's greedy picks [T]: two Triton launches with the fused tree ops (kernels/argmax.py), else
        torch.argmax (its twin)."""
        if self.fused_tree_ops:
            from ddtree_bench.engine.gpu.kernels.argmax import argmax_rows

            return argmax_rows(logits)
        return logits.argmax(dim=-1)

    def _commit_ar(self, b: _Bucket) -> None:
        self.bonus.copy_(b.out.walked)
        self.start.add_(1)

    # ------------------------------------------------------------------ one round

    def _run(self, b: _Bucket, name: str, laps: Laps | None) -> None:
        b.out.store(name, b.stages[name].run())
        if laps is not None:
            laps.mark(name)

    def _queue_draft(self, b: _Bucket, first: bool, host: HostState, laps: Laps) -> None:
        """Queue the draft of a speculative round (a no-op for AR): eager in round 1 (its context is the
        whole prompt) and for proposers other than the DFlash drafter (they need host state), else the
        captured draft stage, which reads only device buffers."""
        if b.method == "ar":
            return
        if self.drafter is None:
            ctx = host.prefill_hidden if first else self.ctx[: host.a]
            self.dlogits.copy_(self.proposer.propose(ctx, host.bonus, self.dcache, host.draft_len, host.start))
        elif first:
            self._draft(host.prefill_hidden)
        else:
            if self.draft_stage is None:
                self.draft_stage = Stage(lambda: self._draft(self.ctx), self.device, self.draft_pool, self.graphs, name="draft")
            self.draft_stage.run()
        laps.mark("draft")

    def _launch(self, b: _Bucket, first: bool, drafted: bool, ahead: bool, host: HostState, laps: Laps,
                temperature: float, top_p: float, gen) -> bool:
        """Queue one round and return at once: its draft (unless `drafted`, queued ahead already), tree build
        .. walk, the copy of the walk result to the host, the commit, and - if `ahead` and the next
        draft needs no host state - the next round's draft. Returns whether that draft was queued."""
        if not drafted:
            self._queue_draft(b, first, host, laps)
        self._tree_and_walk(b, laps, temperature, top_p, gen)
        self._run(b, "commit", laps)
        if ahead and b.method != "ar" and self.drafter is not None and not (first and b.fallback is not None):
            self._queue_draft(b, False, host, laps)
            return True
        return False

    def _tree_and_walk(self, b: _Bucket, laps: Laps | None, temperature: float, top_p: float, gen) -> None:
        """Queue tree build .. walk and the copy of the walk result to the host (its ticket: `b.last`)."""
        if b.method != "ar":
            self._run(b, "tree_build", laps)
            self._run(b, "tree_compile", laps)
        self._run(b, "verify", None)
        if temperature >= GREEDY_EPS:
            if b.fallback is not None:   # a redo (_redo) draws again from this state, as an unflagged round draws
                self._drawn_from = gen.get_state()
            b.post.copy_(pick(b.out.verified.logits, temperature, top_p, gen))
        if laps is not None:
            laps.mark("verify")
        self._run(b, "walk", None)
        b.last = b.ring.put(b.out.walked)
        if laps is not None:
            laps.mark("walk")

    def note_cold(self, method: str, budget: int, seconds: float) -> None:
        """Record (cold_s) and tell (cold_notice) a new shape's first-round time."""
        key = (method, budget if method == "ddtree" else 0)
        self.cold_s[key] = seconds
        cold_notice(method + (f" B={budget}" if method == "ddtree" else ""), seconds, self.device)

    def _redo(self, b: _Bucket, temperature: float, top_p: float, gen) -> tuple[_Bucket, list[int]]:
        """A round whose pruned build raised its certificate flag, redone with the exact PyTorch builder: the
        queued commit saw the flag and kept every buffer as it was, and dlogits hold this round's draft (a
        draft queued ahead recomputed it from the same state). A sampled round's generator goes back to the
        state the flagged round drew from, so the redo draws what an unflagged round draws. Returns the
        fallback bucket and its walk result (its commit queued)."""
        self.redone_rounds += 1
        b.builder.flag.zero_()
        if temperature >= GREEDY_EPS:   # the flagged round's draw is discarded: draw from where it started
            gen.set_state(self._drawn_from)
        done = b.fallback
        self._tree_and_walk(done, None, temperature, top_p, gen)
        res = self._result(done)
        self._run(done, "commit", None)
        return done, res

    def _result(self, b: _Bucket) -> list[int]:
        """Wait for the walk result of the round queued last on `b` (not for the stages queued after it)."""
        return b.last.take()

    # ------------------------------------------------------------------ generate

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], method: str, budget: int, max_new_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int | None = None, stop_ids=(), on_chunk: Callable[[list[int]], None] | None = None,
                 record_trees: bool = False, return_logit_gaps: bool = False,
                 yield_to: Callable[[], bool] | None = None) -> Generation | Suspended:
        """One request to its end (a Generation). With `yield_to`, asked after each round that another round would
        follow, before that round is queued: True stops the generation there and returns it as `Suspended` (the
        batched loop hands a request running alone over to a batch that way: batch_loop.BatchFastLoop.run_alone).
        `self.rounds` then holds the stage times of the rounds whose results were read - also when it raised (an
        on_chunk's error, a cancellation), so a caller can count the rounds a failed request ran."""
        dev = self.device
        self.rounds = []   # this generation's, even if it fails before its first round
        P = len(prompt_ids)
        spec = method != "ar"
        bs = self.proposer.block_size if spec else 1
        width_hint = 1 + (budget if method == "ddtree" else bs - 1) if spec else 1
        self._ensure(P + max_new_tokens + max(width_hint, bs) + bs + 1)  # + bs: a draft queued ahead
        greedy = temperature < GREEDY_EPS
        gen = request_generator(dev, temperature, seed)
        layers = self.proposer.target_layer_ids if spec else ()
        t_cold, known = time.perf_counter(), len(self.buckets)
        b = self._bucket(method, budget, greedy, ctx_rows=P)
        cold = len(self.buckets) > known   # a new shape: its builder checked, its GEMMs compiled, its graphs to capture

        t_start = time.perf_counter_ns()
        gaps: list[float] = []
        stream = OutputStream(max_new_tokens, stop_ids, on_chunk)

        # prefill (plain forward into the same cache storage)
        ids = torch.tensor(prompt_ids, dtype=torch.long, device=dev)
        logits, hidden = self.target(ids, torch.arange(P, device=dev), self.tcache, 0, hidden_layers=layers, last_logits_only=True)
        first_pick = pick(logits, temperature, top_p, gen)
        bonus = int(first_pick[0])
        if return_logit_gaps:
            gaps.extend(logit_gaps(logits))
        self.bonus.copy_(first_pick[:1])
        self.start.fill_(P)
        self.ctx_start.fill_(0)
        t_first = time.perf_counter_ns()
        stream.emit([bonus], t_first)
        state = Suspended(HostState(prefill_hidden=hidden, bonus=bonus, start=P), stream, gen, [],
                          [] if record_trees else None, gaps, stage_totals(t_first - t_start, []), t_start, t_first)
        ask = Ask(method, budget, max_new_tokens, temperature, top_p, return_logit_gaps, P)
        return self._rounds_of(state, b, ask, yield_to, t_cold if cold else None, None)

    @torch.inference_mode()
    def resume(self, state: Suspended, method: str, budget: int, max_new_tokens: int, temperature: float, top_p: float,
               return_logit_gaps: bool, num_prompt_tokens: int, yield_to: Callable[[], bool] | None = None,
               drafted: Laps | None = None) -> Generation | Suspended:
        """Go on with a generation stopped between two rounds, from its next round, as `generate` would have gone on:
        `state` is this loop's own Suspended, or a batched request's state on the buffers this loop runs on (the
        batched loop hands its last request back that way: batch_loop.BatchFastLoop.resume_alone). `drafted`: the
        stage marks of that round's draft when it is queued already (it reads only device state), else the round
        drafts first. Returns as generate does; the Generation's lists are `state`'s, grown, its stage_ns
        `state.stage_ns` plus this run's rounds, and `self.rounds` this run's rounds only."""
        self.rounds = []
        b = self._bucket(method, budget, temperature < GREEDY_EPS)
        ask = Ask(method, budget, max_new_tokens, temperature, top_p, return_logit_gaps, num_prompt_tokens)
        return self._rounds_of(state, b, ask, yield_to, None, drafted)

    def _rounds_of(self, state: Suspended, b: _Bucket, ask: Ask, yield_to: Callable[[], bool] | None,
                   t_cold: float | None, drafted_laps: Laps | None) -> Generation | Suspended:
        """The rounds of generate / resume, from `state` to the end or to a suspension (t_cold: when a new bucket was
        set up, for its cold-start notice)."""
        dev = self.device
        method, budget, max_new_tokens = ask.method, ask.budget, ask.max_new_tokens
        temperature, top_p, return_logit_gaps = ask.temperature, ask.top_p, ask.return_logit_gaps
        spec = method != "ar"
        host, stream, gen, trees, gaps = state.host, state.stream, state.gen, state.trees, state.gaps
        accept_lengths = state.accept_lengths
        out = stream.out
        n0 = len(accept_lengths)
        drafted = drafted_laps is not None
        laps = drafted_laps
        if laps is None:
            laps = Laps(dev, self.spent_events)
            laps.mark("begin")

        def ahead(emitted: int, stopped: bool) -> bool:
            """The round after the one being queued may run (the queued one emits at least one token)."""
            return spec and not stopped and emitted + 1 < max_new_tokens

        pending = wants_round(len(out), stream.stopped, n0, max_new_tokens, spec)
        suspended = False
        try:
            if pending:
                drafted = self._launch(b, host.prefill_hidden is not None, drafted, ahead(len(out), stream.stopped), host,
                                       laps, temperature, top_p, gen)
            while pending:
                res = self._result(b)
                if t_cold is not None:
                    self.note_cold(method, budget, time.perf_counter() - t_cold)
                    t_cold = None
                done = b   # the bucket whose stages produced this round's committed result
                if spec and b.layout.read(res).flagged:  # the pruned build could not certify its tree: redo exactly
                    done, res = self._redo(b, temperature, top_p, gen)
                    drafted = False
                now = time.perf_counter_ns()
                if spec:
                    walk = done.layout.read(res)
                    a, new_tokens = walk.a, walk.new_tokens
                    if trees is not None:
                        t = done.out.tree
                        trees.append(RoundTrace(t.tok.tolist(), t.par.tolist(), t.dep.tolist(), walk.accepted))
                    if return_logit_gaps:
                        keep = torch.tensor(walk.accepted, device=dev)
                        gaps.extend(logit_gaps(done.out.verified.logits.index_select(0, keep)))
                else:
                    a = 1
                    new_tokens = [res[0]]
                    if return_logit_gaps:
                        gaps.extend(logit_gaps(b.out.verified.logits))
                accept_lengths.append(a)
                host = HostState(prefill_hidden=None, bonus=new_tokens[-1], start=host.start + a, draft_len=host.start, a=a)
                stopped = stream.stopped or any(t in stream.stops for t in new_tokens)
                emitted = len(out) + len(stream.visible(new_tokens))
                pending = wants_round(emitted, stopped, len(accept_lengths), max_new_tokens, spec)
                if pending and yield_to is not None and yield_to():
                    stream.emit(new_tokens, now)
                    suspended = True
                    break
                if pending:  # queue the next round before handing tokens out, so callbacks overlap the GPU
                    drafted = self._launch(b, False, drafted, ahead(emitted, stopped), host, laps, temperature, top_p, gen)
                stream.emit(new_tokens, now)
            t_done = time.perf_counter_ns()   # (a draft queued ahead of a stop token may still be running)
        finally:   # the rounds read so far, on every way out (a round queued ahead of the end, or of an error, is not)
            self.rounds = laps.rounds()[: len(accept_lengths) - n0]
        totals = {k: ns + state.stage_ns.get(k, 0) for k, ns in stage_totals(0, self.rounds).items()}
        if suspended:
            return Suspended(host, stream, gen, accept_lengths, trees, gaps, totals, state.t_start_ns,
                             state.t_first_token_ns)
        return Generation(
            output_ids=out,
            accept_lengths=accept_lengths,
            finish_reason=stream.finish_reason,
            num_prompt_tokens=ask.num_prompt_tokens,
            stage_ns=totals,
            t_start_ns=state.t_start_ns,
            t_first_token_ns=state.t_first_token_ns,
            t_done_ns=t_done,
            chunk_times_ns=stream.chunk_times_ns,
            chunk_tokens=stream.chunk_tokens,
            trees=trees,
            logit_gaps=gaps[: len(out)] if return_logit_gaps else None,
        )
