"""The batched fast loop: continuous batching on fixed shapes and CUDA graphs (batch.BatchLoop's fast twin).

Same API and same tokens as `batch.BatchLoop` (its slow obvious twin), organised like
`loop.FastLoop` (the batch-1 fast loop) for a GPU:
* up to `max_batch` requests in flight for one method and one budget; each request owns a
  *slot*: its region of slotted KV caches ([layers, max_batch, Hkv, S, D], target and drafter), its
  entries in the per-slot device buffers (frontier `start`, drafter frontier `ctx_start`, bonus,
  context rows `ctx`, draft logits, picks `post`, `live`);
* a round runs over a *bucket* of the first b slots, b the smallest of BUCKETS (1, 2, 4, 8, 16, ...,
  and max_batch) that holds every active request; the live requests always occupy slots 0..n-1
  (a retirement moves the highest slots down, `_pack`), and slots n..b-1 are padding: they
  compute in their own regions at frontier 0 and their commit is masked out (`live` = 0), so
  they emit nothing and never move;
* a bucket of ONE request runs FastLoop's own stages (loop.FastLoop, adopting views of slot 0's buffers:
  `solo`): the Triton tree builder its budget rule names, with its certificate flag and exact redo, the
  live-slot and tree attention kernels, the fused compile / walk / commit, and the next round's draft
  queued before the host reads the walk result - so a batched server that sees one request at a time
  runs batch 1's loop, kernel for kernel (the plain DFlash drafter and AR; other proposers take the
  batched stages below at every bucket); and a request that finds the batch empty can run through FastLoop's
  `generate` itself on those buffers (`run_alone`, what a scheduler does for a lone request), handed over to the
  batch between two rounds when others arrive;
* a round over a bucket of two or more is FastLoop's six stages over the bucket, each a fixed-shape
  function captured lazily as one CUDA graph per (bucket, budget) on its first use (graphs.Stage):
  draft - ONE drafter forward over every slot (batch_forward.draft_forward_batch); tree_build - every
  slot's tree in one call: on CUDA the Triton kernel the single loop's rule names at the budget, launched over the
  slots (builders.batched_kernel: the one-block kernel over one program per slot up to B = 32, the grid kernels over a
  slot axis above; kernels/tree_block.SlottedTreeBuilder, kernels/tree_grid.SlottedGridBuilder: the single loop's
  compiled kernels, on the exact builder's log-probs) once it passed builders.checked_slotted for this loop, else the
  exact batched builder (batch_tree.BatchTreeBuilder: tree_vector.StaticTreeBuilder batched over the slots, the same
  trees) - or DFlash's chain of every slot; tree_compile - every slot's ids, positions,
  ancestor matrix and bias over its own region; verify - ONE target forward over the concatenated trees
  (batch_forward.target_forward_batch: each slot's rows see only its own prefix and its own ancestors)
  and the greedy picks; walk; commit (live slots only). With the Triton tree kernels (tree_kernels.available)
  compile, walk and commit are one launch each for all slots (kernels/tree_verify.compile_trees /
  walk_trees / commit_trees) and the picks are kernels/argmax.py's; their twins, tree_ops per slot, run
  on CPUs;
* the slotted kernel prunes candidates and checks a certificate, as the single loop's: its one flag for all
  slots rides at the end of every slot's walk result (WalkLayout(L, guard=True)), the queued commit sees it on
  the device and changes nothing, and after the host has read it the round is redone by the bucket's exact
  stages (`fallback`, eager; `redone_rounds` counts these and the solo loop's);
* sampled requests (T > 0) overwrite their slot's picks between verify and walk with `pick` on
  their own verify rows and their own generator, eagerly: each request owns a `torch.Generator`
  seeded with its `seed` (0 when None) and draws from it exactly what batch 1 draws (the prefill's
  token, then one `pick` over its verify rows per round; a redone round's generator goes back to the state
  its discarded draw started from), so T > 0 outputs equal batch 1 token for token whoever shares the batch
  (batch.py's rule);
* one host sync a round (two for a redone one): the walk results of all slots ([b, WalkLayout.size_guarded])
  reach pinned host memory; then the host emits every request's tokens, retires finished ones and admits waiting
  ones (between rounds, as BatchLoop does).
Admission runs the request's prefill alone (the plain Target.forward into its slot's region, as
FastLoop does) and, with the DFlash drafter, writes its prompt's drafter context into its drafter
region (forward.draft_forward, a one-token block), so its first batched draft sees exactly what
FastLoop's eager round-1 draft sees. A proposer other than the plain DFlash drafter (tests rig
one; a drafter variant of draft_variants.py) drafts eagerly per slot through its own `propose`, or
once per round through `propose_batch`.
Per request everything follows BatchLoop/PlainLoop: the last-round rule (interface.wants_round),
the output cut, a_r counting the root, stop ids, max_new_tokens, temperature, top_p, trees, gaps.
The cache grows (and every graph is dropped) when an admitted request needs more slots per region.

The verify and the draft attend with the single loop's live-slot / tree kernels given a slot axis
(batch_forward.py: each slot reads only its own live cache slots; SDPA over every region is the twin).
As at batch 1, the next round's draft is queued before the host reads the walk results (with the plain DFlash
drafter: `_queue_draft`), so the host's reading, emitting and retiring overlap the device's next draft; AR queues
the whole next round instead, from two requests up (`_ar_step`: two rounds in flight, each read for the requests
still active; none queued ahead while requests wait for a slot, so they join the next round as in BatchLoop; one
admitted by a scheduler while a round is in flight joins the round after it); one request alone queues its next
round once the round before is read, before that round's token goes out (the single loop's order). On a CPU the
same code runs without capture, which is how CI checks it. `rounds` holds per round the batch size, the bucket and the
stage times (ms), for bench-engine --batch.
Knows nothing of threads or HTTP (batch_scheduler.BatchScheduler drives it like a BatchLoop).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Callable

import torch

from ddtree_bench.engine.batch import BatchGeneration, BatchLoop, BatchRequest, BatchStats, Cancelled, ProposeRow, Retired, _Active, split_retired
from ddtree_bench.engine.cache import KVCache
from ddtree_bench.engine.gpu import builders
from ddtree_bench.engine.gpu.batch_forward import draft_forward_batch, target_forward_batch
from ddtree_bench.engine.gpu.batch_tree import BatchTreeBuilder, BatchTrees
from ddtree_bench.engine.gpu.forward import StaticKV, draft_forward, draft_visible, group_size, visible_bias
from ddtree_bench.engine.gpu.fused import merge_projections, ops_for
from ddtree_bench.engine.gpu.graphs import Pool, Stage
from ddtree_bench.engine.gpu.loop import CAPACITY_ALIGN, FOLD, FastLoop, HostState, Laps, ResultRing, Suspended, Ticket, cold_notice
from ddtree_bench.engine.gpu.tree_ops import ancestors, commit_static, verify_visible, walk_static
from ddtree_bench.engine.interface import METHODS, OutputStream, RoundTrace, WalkLayout, logit_gaps
from ddtree_bench.engine.proposer import DFlashProposer
from ddtree_bench.engine.verify import GREEDY_EPS, pick, request_generator

__all__ = ["BatchFastLoop", "buckets_for", "Cancelled"]

SETTLE_ROUNDS = 1024   # rounds whose stage marks may wait unread (_settle): at most a few ms of reading at once


def buckets_for(max_batch: int) -> tuple[int, ...]:
    """The batch buckets: powers of two below max_batch, then max_batch (8 -> 1, 2, 4, 8; 6 -> 1, 2, 4, 6)."""
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return tuple(out) + (max_batch,)


def slot_cache(k: torch.Tensor, v: torch.Tensor, slot: int) -> KVCache:
    """Slot `slot`'s region of slotted K/V tensors [layers, B, Hkv, S, D] as a KVCache (views, no copy),
    for the plain forwards (prefill) and forward.StaticKV."""
    c = KVCache.__new__(KVCache)
    c.k, c.v = k[:, slot], v[:, slot]
    return c


@dataclass(eq=False)
class _Slot(_Active):
    """A request in flight (BatchLoop's state) plus its slot and what a host-side proposer needs."""

    slot: int = 0
    a: int = 0
    prefill_hidden: torch.Tensor | None = None
    settle: Any = None   # the loop's _settle: its rounds' stage times not yet read, read before a Generation is built

    def generation(self, t_done_ns: int | None = None):
        t_done_ns = time.perf_counter_ns() if t_done_ns is None else t_done_ns   # its last token, not the reading
        if self.settle is not None:
            self.settle()
        return super().generation(t_done_ns)


class _Bucket:
    """The stages of one batch bucket, the latest outputs each stage left for the next, its tree builder and walk
    layout (guarded when the builder can raise a certificate flag), and then the exact twin of its tree build ..
    commit stages (`fallback`, eager) that redoes a flagged round."""

    def __init__(self, b: int, device: torch.device, builder=None, layout: WalkLayout | None = None):
        self.b = b
        self.pool = Pool(device)
        self.stages: dict[str, Stage] = {}
        self.out: dict[str, Any] = {}
        self.builder = builder
        self.layout = layout
        self.fallback: _Bucket | None = None

    @property
    def stride(self) -> int:
        """Elements per slot of this bucket's walk result on the host (AR: the pick)."""
        return self.layout.size_guarded if self.layout is not None else 1

    def release(self) -> None:
        for s in self.stages.values():
            s.release()
        self.out.clear()
        if self.fallback is not None:
            self.fallback.release()


@dataclass
class _Round:
    """What a round leaves for _finish_round: the walk results on the host (`stride` elements per slot), every
    slot's tree (spec), the verify logits and the round's stage marks (read later: _settle)."""

    res: list[int]
    stride: int
    tree_of: Any
    logits: torch.Tensor
    laps: Laps


def _cancellable(req: BatchRequest) -> Callable[[list[int]], None] | None:
    """`req.on_chunk`, raising Cancelled before a chunk once `req.cancelled()` says so, for a request run by the solo
    loop (run_alone / resume_alone), which has no batch step between rounds to see it (batch.retirement)."""
    cancelled, emit = req.cancelled, req.on_chunk
    if cancelled is None:
        return emit

    def on_chunk(tokens: list[int]) -> None:
        if cancelled():
            raise Cancelled()
        if emit is not None:
            emit(tokens)

    return on_chunk


def _may_continue(st: _Slot) -> bool:
    """Whether a round after the next one could still emit for `st`: not stopped, and its next token leaves room
    below max_new_tokens (the next round's own token not yet known)."""
    return not st.stream.stopped and len(st.stream.out) + 1 < st.req.max_new_tokens


@dataclass
class _Queued:
    """An AR round queued before the host read the round before it (`_ar_step`): its requests with the slots they
    had then (a later retirement may move them), its bucket, its ticket and stage marks, and, on its bucket's first
    round, when that bucket was set up."""

    members: list[tuple[_Slot, int]]
    bucket: int
    ticket: Ticket
    laps: Laps
    logits: torch.Tensor   # the verify's (its graph's static output: this round's until the next one on the bucket)
    t_cold: float | None = None


class BatchFastLoop:
    """The batched fast loop (module docstring); BatchLoop's constructor arguments plus `graphs`."""

    kind = "fast"   # which batched loop ran (run.json / summary.json say it)

    def __init__(self, target, proposer, method: str, budget: int, max_batch: int, graphs: bool = True,
                 layer_ops: str = "auto", capacity: int = 0, tree_kernel: str = "auto"):
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}")
        if tree_kernel not in builders.KINDS:
            raise ValueError(f"unknown tree kernel {tree_kernel!r}: {' | '.join(builders.KINDS)}")
        if method != "ar" and proposer is None:
            raise ValueError(f"method {method!r} needs a drafter")
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        if method == "ddtree" and budget <= 0:
            raise ValueError("the batched fast loop needs a DDTree budget > 0")
        self.target, self.proposer = target, proposer
        self.method, self.budget, self.max_batch = method, budget, max_batch
        self.spec = method != "ar"
        # the static batched draft is the plain DFlash drafter's; a variant drafter (draft_variants.py) or any other
        # proposer drafts through its own propose(), per slot, as BatchLoop calls it
        plain_dflash = self.spec and type(proposer) is DFlashProposer and getattr(proposer.drafter, "variant", None) is None
        self.drafter = proposer.drafter if plain_dflash else None
        self.device = target.lm_head.weight.device
        self.dtype = target.lm_head.weight.dtype
        self.graphs = graphs and self.device.type == "cuda"
        self.layer_ops = layer_ops
        self.tree_kernel = tree_kernel   # auto | block | grid | grid-keys | torch: the solo loop's, and builders.batched_kernel's
        self.buckets = buckets_for(max_batch)
        self.layers = tuple(proposer.target_layer_ids) if self.spec else ()
        self.block_size = proposer.block_size if self.spec else 1
        self.L = self.block_size - 1
        self.builder = None
        if method == "ddtree":
            self.builder = BatchTreeBuilder(self.L, target.cfg.vocab_size, budget, self.device, logits_dtype=self.dtype)
        self.width = 1 + (self.builder.N if method == "ddtree" else self.L) if self.spec else 1
        self.layout = WalkLayout(self.L) if self.spec else None
        self.result_size = self.layout.size + 1 if self.spec else 1   # per slot on the host, room for the flag
        self.tgroup = group_size(target)
        self._slotted: Any = None     # the checked slotted Triton builder (builders.checked_slotted), once looked for
        self._slotted_looked = False
        self._redone = 0              # batched rounds redone with the exact builder after a failed certificate
        # a bucket of one: FastLoop's stages on slot 0 (module docstring); None where a proposer drafts on the host
        self.solo = FastLoop(target, proposer if self.spec else None, graphs=graphs, layer_ops=layer_ops,
                             tree_kernel=tree_kernel) if method == "ar" or self.drafter is not None else None
        self._ahead: Laps | None = None   # the next round's draft, queued: its laps (begin, draft)
        self._ahead_bucket = 0            # ... for this bucket (1: the solo loop's draft; b: the batched draft of b slots)
        self._inflight: deque[_Queued] = deque()   # AR rounds queued, not yet read (at most ResultRing.DEPTH)
        self.pipeline_ar = True           # AR keeps two rounds in flight (_ar_step); False: one (A/B timing)
        self.lone_resumes = False         # a scheduler takes a lone request back to the solo loop after each step
        #                                   (resume_alone): AR then queues no round ahead of one request alone
        self._last: Ticket | None = None  # the ticket of the batched round queued last
        self.cold_s: dict[int, float] = {}   # bucket -> s from its new stages to its first result (bucket 1: solo's)
        self.active: list[_Slot] = []
        self.stats = BatchStats(max_batch)
        self._rounds: list[dict[str, Any]] = []  # per round: batch, bucket, stage -> ms (`rounds`)
        self._untimed: list[tuple[Laps, int, int, list[_Slot]]] = []   # rounds whose stage marks are unread (_settle)
        self.spent_events: list = []      # CUDA events read and free for the next round's Laps (Laps.pool)
        self.capacity = 0
        self._stages: dict[int, _Bucket] = {}
        for m in (target, self.drafter):   # before any capture: the merge allocates
            if m is not None:
                merge_projections(m)
        if capacity:
            self._ensure(capacity)

    # ------------------------------------------------------------------ buffers

    @property
    def ops(self):
        return ops_for(self.device, self.dtype, self.layer_ops)

    @property
    def rounds(self) -> list[dict[str, Any]]:
        """Per round so far: batch, bucket, stage -> ms (bench-engine --batch reads them)."""
        self._settle()
        return self._rounds

    def _time_later(self, laps: Laps, n: int, bucket: int, members: list[_Slot]) -> None:
        """A finished round of n requests (`members`) over `bucket`: its marks wait for _settle, which runs now only
        once SETTLE_ROUNDS rounds wait."""
        self._untimed.append((laps, n, bucket, members))
        if len(self._untimed) >= SETTLE_ROUNDS:
            self._settle()

    def _settle(self) -> None:
        """Read the stage marks of the rounds finished so far (their CUDA events, the last commit's waited for) into
        `rounds` and each request's stage_ns. Not between one round's result and the next round's queueing, where
        the host's microseconds show on small models (the single loop reads its marks after the generation too):
        when a request retires (its Generation wants its stage_ns), when `rounds` is read, and every SETTLE_ROUNDS
        rounds so that the marks held stay few. Marks that cannot be read (an error reading them) are dropped with
        the error, not read again at every later retirement."""
        untimed, self._untimed = self._untimed, []
        for laps, n, b, members in untimed:
            stage_ms = laps.rounds()[0]
            self._rounds.append({"batch": n, "bucket": b, **stage_ms})
            for st in members:
                for k, ms in stage_ms.items():
                    st.stage_ns[FOLD[k]] += int(ms * 1e6)

    @property
    def free_slots(self) -> int:
        return self.max_batch - len(self.active)

    @property
    def redone_rounds(self) -> int:
        """Rounds rebuilt with an exact builder after a failed tree certificate: batched rounds and solo ones."""
        return self._redone + (self.solo.redone_rounds if self.solo is not None else 0)

    @property
    def tree_builder(self) -> str | None:
        """Name of the builder of the latest batched DDTree rounds (None before the first one): the slotted Triton
        kernel's or the exact batched builder's."""
        if self.builder is None or not self._slotted_looked:
            return None
        return (self._slotted or self.builder).name

    def release(self) -> None:
        """Free every captured graph now (after a draft queued ahead has run: its graph must not go mid-flight)."""
        for laps in ([self._ahead] if self._ahead is not None else []) + [q.laps for q in self._inflight]:
            if laps.cuda:
                laps.marks[-1][1].synchronize()   # (in-flight AR rounds stay: their results are on the host)
        self._ahead = None
        for bk in self._stages.values():
            bk.release()
        self._stages = {}
        if self.solo is not None:
            self.solo.release()

    @property
    def fused_tree_ops(self) -> bool:
        """Compile, walk, commit and the picks as one Triton launch each over the bucket (kernels/tree_verify.py)."""
        from ddtree_bench.engine.gpu import tree_kernels

        return tree_kernels.available(self.device)

    def _ensure(self, capacity: int) -> None:
        """Slotted caches and per-slot buffers with at least `capacity` slots per region; growing keeps
        the live regions' contents and drops every graph (they point at the old buffers)."""
        cap = -(-capacity // CAPACITY_ALIGN) * CAPACITY_ALIGN
        if cap <= self.capacity:
            return
        dev, B, t = self.device, self.max_batch, self.target
        old = getattr(self, "tk", None)
        self.release()

        def slotted(make):
            shape = make(1).k.shape   # (layers, Hkv, 1, D)
            return [torch.zeros(shape[0], B, shape[1], cap, shape[3], dtype=self.dtype, device=dev) for _ in range(2)]

        new = {"tk": None}
        new["tk"], new["tv"] = slotted(t.new_cache)
        if self.drafter is not None:
            new["dk"], new["dv"] = slotted(self.proposer.new_cache)
        if old is not None:
            oc = self.capacity
            for name, tensor in new.items():
                tensor[..., :oc, :].copy_(getattr(self, name))
        for name, tensor in new.items():
            setattr(self, name, tensor)
        if old is None:
            long = dict(dtype=torch.long, device=dev)
            self.start = torch.zeros(B, **long)
            self.ctx_start = torch.zeros(B, **long)
            self.bonus = torch.zeros(B, **long)
            self.live = torch.zeros(B, **long)
            self.post = torch.zeros(B, self.width, **long)
            self.ring = ResultRing(B * self.result_size, dev)
            if self.spec:
                nh = len(self.layers) * t.cfg.hidden_size
                self.ctx = torch.zeros(B, self.block_size, nh, dtype=self.dtype, device=dev)
                self.dlogits = torch.zeros(B, self.L, t.cfg.vocab_size, dtype=self.dtype, device=dev)
            if self.drafter is not None:
                d = self.drafter
                self.mask_tail = torch.full((self.block_size - 1,), d.mask_token_id, dtype=torch.long, device=dev)
                self.dgroup = group_size(d)
                kinds = list(zip(d.cfg.layer_causal, d.cfg.layer_window))
                self.draft_kind = [kinds.index(k) for k in kinds]   # layers with equal masks share one bias
            self.pcache: list[Any] = [None] * B   # a host-side proposer's own cache per slot
        if self.spec and self.drafter is None:   # a host-side proposer's own caches: new ones for the free slots
            live = {st.slot for st in self.active}   # (a live request keeps its cache: it fit at admission)
            self.pcache = [self.pcache[i] if i in live else self.proposer.new_cache(cap) for i in range(B)]
        self.capacity = cap
        self._ahead = None
        if self.solo is not None:   # slot 0's views (a growth made new tensors; the solo graphs are dropped)
            self.solo.adopt(cap, slot_cache(self.tk, self.tv, 0), self.start[0], self.ctx_start[0], self.bonus[0:1],
                            slot_cache(self.dk, self.dv, 0) if self.drafter is not None else None,
                            self.dlogits[0] if self.spec else None, self.ctx[0] if self.spec else None)
        if dev.type == "cuda" and old is not None:
            del old
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ admission

    check = BatchLoop.check   # the checks Engine.generate makes (ValueError)

    def _now(self) -> int:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter_ns()

    @torch.inference_mode()
    def admit(self, req: BatchRequest) -> Retired | None:
        """Prefill `req` alone into the lowest free slot (needs one). Returns its Retired at once when it
        needs no round (max_new_tokens = 1, AR's first token a stop, an on_chunk error)."""
        self.check(req)
        if self.free_slots <= 0:
            raise RuntimeError("no free slot in the batch")
        dev = self.device
        P = len(req.prompt_ids)
        self._ensure(self._room(req))
        i = len(self.active)   # live slots are 0..n-1
        self._ahead = None     # the next round is another bucket: its draft recomputes slot 0's
        gen = request_generator(dev, req.temperature, req.seed)   # batch 1's seeding, so batch 1's draws
        tcache = slot_cache(self.tk, self.tv, i)
        t0 = self._now()
        st = _Slot(req, None, self.pcache[i], gen, OutputStream(req.max_new_tokens, req.stop_ids, req.on_chunk), t0,
                   trees=[] if req.record_trees else None, slot=i, settle=self._settle)
        ids = torch.tensor(req.prompt_ids, dtype=torch.long, device=dev)
        logits, hidden = self.target(ids, torch.arange(P, device=dev), tcache, 0, hidden_layers=self.layers,
                                     last_logits_only=True)
        first = pick(logits, req.temperature, req.top_p, gen)
        st.bonus = int(first[0])
        if req.return_logit_gaps:
            st.gaps.extend(logit_gaps(logits))
        self.bonus[i : i + 1].copy_(first[:1])
        self.start[i].fill_(P)
        self.ctx_start[i].fill_(P)
        self.live[i].fill_(1)
        st.t_first = self._now()
        st.stage_ns["prefill"] += st.t_first - t0
        st.start, st.draft_len, st.prefill_hidden = P, 0, hidden
        st.emit([st.bonus], st.t_first)
        self.stats.admitted += 1
        self.active.append(st)
        done = self._retire(only=[st])
        return done[0] if done else None

    def _room(self, req: BatchRequest) -> int:
        """Cache slots a request needs in its region: prompt, tokens, the widest verify (the batch's width, or FastLoop's
        B + 1 where a lone request runs FastLoop.generate: `run_alone`) and a draft queued ahead."""
        widest = max(self.width, 1 + self.budget if self.method == "ddtree" else 0, self.block_size)
        return len(req.prompt_ids) + req.max_new_tokens + widest + self.block_size + 1

    @property
    def can_run_alone(self) -> bool:
        """Whether `run_alone` can serve a request (AR, or the plain DFlash drafter: the solo loop exists)."""
        return self.solo is not None

    @torch.inference_mode()
    def run_alone(self, req: BatchRequest, yield_to: Callable[[], bool]) -> Retired | None:
        """Serve `req` on an empty batch through the single loop itself (`FastLoop.generate` on slot 0's buffers, what
        `serve --max-batch 1` runs, with none of the batch's per-round bookkeeping) until it ends - its Retired - or
        until `yield_to()` says, after a round, that others wait: then it stops between rounds and joins the batch
        as slot 0 (None; the caller admits the others and steps). The hand-over moves no data: the single loop ran
        on slot 0's caches and frontier buffers, so the request goes on exactly as after a solo round (its queued
        draft, if any, is recomputed by the next round, as after any admission). Its rounds so far count in `stats`
        and `rounds` as rounds of one. A cancellation (`req.cancelled`) is seen before each chunk goes out; an error
        (its on_chunk's, the engine's) ends this request only, as an admission's prefill error does, its rounds
        before the error counted as a batched request's are."""
        self.check(req)
        if self.active or self.solo is None:
            raise RuntimeError("run_alone needs an empty batch and the solo loop")
        self._ensure(self._room(req))
        self._ahead = None
        on_chunk = _cancellable(req)
        self.stats.admitted += 1
        return self._alone(req, [], lambda: self.solo.generate(
            req.prompt_ids, self.method, self.budget, req.max_new_tokens, req.temperature, req.top_p, req.seed,
            req.stop_ids, on_chunk=on_chunk, record_trees=req.record_trees, return_logit_gaps=req.return_logit_gaps,
            yield_to=yield_to))

    @property
    def can_resume_alone(self) -> bool:
        """Whether `resume_alone` can take the batch's only request: the solo loop exists, the request (slot 0) has run
        its first round and nothing of it is in flight but a draft (an AR round queued ahead is not: `lone_resumes`)."""
        return (self.solo is not None and len(self.active) == 1 and not self._inflight and self.active[0].slot == 0
                and self.active[0].prefill_hidden is None and self.active[0].error is None)

    @torch.inference_mode()
    def resume_alone(self, yield_to: Callable[[], bool]) -> Retired | None:
        """run_alone's reverse: the batch's only request (slot 0: live requests are packed down) goes on through the
        single loop (`FastLoop.resume` on slot 0's buffers) from its next round, with the draft the last solo round
        queued for it taken as that round's; returns as run_alone does (None: others waited again after a round,
        and it is slot 0 of the batch once more). Nothing moves: the batch's rounds of one already ran FastLoop's
        stages on those buffers. What a scheduler runs after a step leaves one request (`lone_resumes`), so that a
        request whose batch-mates ended goes on as `--max-batch 1` would serve it."""
        if not self.can_resume_alone:
            raise RuntimeError("resume_alone needs one request in the batch, in slot 0, with nothing of it in flight")
        st = self.active[0]
        self._settle()   # its batched rounds' stage times, into st.stage_ns
        drafted = self._ahead if self._ahead is not None and self._ahead_bucket == 1 else None
        self._ahead = None
        self.active = []
        self.live[0].fill_(0)
        st.stream.on_chunk = _cancellable(st.req)
        state = Suspended(HostState(None, st.bonus, st.start, st.draft_len, st.a), st.stream, st.gen, st.accept_lengths,
                          st.trees, st.gaps, st.stage_ns, st.t_start, st.t_first)
        r = st.req
        return self._alone(r, st.batch_sizes, lambda: self.solo.resume(
            state, self.method, self.budget, r.max_new_tokens, r.temperature, r.top_p, r.return_logit_gaps,
            len(r.prompt_ids), yield_to, drafted))

    def _alone(self, req: BatchRequest, sizes: list[int], go: Callable[[], Any]) -> Retired | None:
        """Run `go` (the solo loop's generate or resume for `req`, on slot 0's buffers) and take what it gives: its
        rounds counted as rounds of one after `sizes` (the request's batch sizes so far), then its Retired (its
        Generation, or the error that ended it), or - Suspended - the request made slot 0 of the batch."""
        try:
            out = go()
        except Exception as e:
            self._count_alone(len(self.solo.rounds))   # the rounds it ran before the error (FastLoop.rounds)
            return Retired(req, None, e)
        n = len(out.accept_lengths) - len(sizes)
        self._count_alone(n)
        sizes = sizes + [1] * n
        if not isinstance(out, Suspended):
            return Retired(req, BatchGeneration(**{f.name: getattr(out, f.name) for f in fields(out)}, batch_sizes=sizes))
        h = out.host
        st = _Slot(req, None, self.pcache[0], out.gen, out.stream, out.t_start_ns, t_first=out.t_first_token_ns,
                   bonus=h.bonus, start=h.start, draft_len=h.draft_len, accept_lengths=out.accept_lengths,
                   trees=out.trees, gaps=out.gaps, stage_ns=out.stage_ns, batch_sizes=sizes, slot=0, a=h.a,
                   settle=self._settle)
        self.live[0].fill_(1)
        self.active.append(st)
        return None

    def _count_alone(self, n: int) -> None:
        """Count the solo loop's last `n` rounds (one request's, run by FastLoop.generate or resume) as rounds of one in
        `stats`, with their stage times (FastLoop.rounds) in `rounds`."""
        self.stats.batch_sizes.extend([1] * n)
        self._settle()   # rounds stay in order
        self._rounds.extend({"batch": 1, "bucket": 1, **stage_ms} for stage_ms in self.solo.rounds)

    def _draft_context(self, i: int, hidden: torch.Tensor, P: int) -> None:
        """Write the prompt's drafter context (positions 0..P-1) into slot i's drafter region: the
        context part of FastLoop's round-1 draft (forward.draft_forward with a one-token block at P,
        whose K/V the first batched draft overwrites). Done before a request's first round when that round
        is batched; a first round alone drafts from the prompt as FastLoop's round 1 does (_solo_round)."""
        d, dev = self.drafter, self.device
        start = torch.tensor(P, device=dev)
        emb = self.target.embed(self.bonus[i : i + 1])
        biases = [visible_bias(draft_visible(d, l, start, 1, self.capacity), self.dtype, self.dgroup)
                  for l in range(len(d.layers))]
        kv = StaticKV(slot_cache(self.dk, self.dv, i))
        draft_forward(d, hidden, emb, kv, torch.zeros((), dtype=torch.long, device=dev), start, biases, self.ops)

    # ------------------------------------------------------------------ retirement and packing

    def _retire(self, only: Sequence[_Slot] | None = None) -> list[Retired]:
        retired, self.active = split_retired(self.active, self.spec, only)
        if not retired:   # the slots are packed already (admission takes slot n)
            return []
        if self._ahead_bucket == 1:   # the solo draft; a batched one moves with its slots (_queue_draft)
            self._ahead = None
        for st, _ in retired:
            self.live[st.slot].fill_(0)
            self.start[st.slot].fill_(0)   # a padding slot computes at frontier 0, inside its region
        self._pack()
        return [done for _, done in retired]

    def _pack(self) -> None:
        """Move live requests from slots >= n into the free slots below n (n = live requests), so a round's
        bucket is the first b slots."""
        n = len(self.active)
        used = {st.slot for st in self.active}
        free = [s for s in range(n) if s not in used]
        for st in self.active:
            if st.slot >= n:
                self._move(st, free.pop(0))

    def _move(self, st: _Slot, dst: int) -> None:
        src = st.slot
        names = ["tk", "tv"] + (["dk", "dv"] if self.drafter is not None else [])
        for name in names:
            t = getattr(self, name)
            t[:, dst].copy_(t[:, src])
        for name in ("start", "ctx_start", "bonus", "live") + (("ctx", "dlogits") if self.spec else ()):
            t = getattr(self, name)
            t[dst].copy_(t[src])
        self.live[src].fill_(0)
        self.start[src].fill_(0)
        self.pcache[dst], self.pcache[src] = self.pcache[src], self.pcache[dst]
        st.slot = dst
        st.dcache = self.pcache[dst]

    @torch.inference_mode()   # it zeroes slot buffers made in inference mode; the scheduler calls it outside step
    def fail_all(self, error: BaseException) -> list[Retired]:
        """End every active request with `error` (a round that raised: its state is unknown)."""
        out = [Retired(st.req, None, error) for st in self.active]
        self._ahead = None
        self._inflight.clear()
        for st in self.active:
            self.live[st.slot].fill_(0)
            self.start[st.slot].fill_(0)
        self.active = []
        return out

    # ------------------------------------------------------------------ stages of a bucket

    def _bucket(self, b: int) -> _Bucket:
        if b in self._stages:
            return self._stages[b]
        if self.device.type == "cuda":   # this bucket's GEMM variants compiled at once, before its stages capture
            from ddtree_bench.engine.gpu.fused import warm_linears

            models = [self.target] + ([self.drafter] if self.drafter is not None else [])
            warm_linears(models, self.ops, sorted({b * self.width} | ({b * self.block_size} if self.spec else set())),
                         self.device)
        builder = self._batch_builder() if self.method == "ddtree" else None
        guard = hasattr(builder, "flag")
        bk = self._stages_of(_Bucket(b, self.device, builder, WalkLayout(self.L, guard) if self.spec else None),
                             self.graphs, self.drafter is not None)
        if guard:   # a flagged round is redone by the exact builder's stages, eagerly (FastLoop's fallback)
            bk.fallback = self._stages_of(_Bucket(b, self.device, self.builder, self.layout), False, False)
        self._stages[b] = bk
        return bk

    def _stages_of(self, bk: _Bucket, graphs: bool, draft: bool) -> _Bucket:
        """bk's stages over slots 0..bk.b-1 (draft: with the draft stage)."""
        b, dev, pool = bk.b, self.device, bk.pool

        def stage(name: str, fn, idempotent: bool = True) -> None:
            bk.stages[name] = Stage(fn, dev, pool, graphs, idempotent=idempotent, name=name)

        if self.spec:
            if draft:
                stage("draft", lambda: self._draft(b))
            stage("tree_build", lambda: self._build(b, bk.builder))
            stage("tree_compile", lambda: self._compile(b, bk.out["tree_build"]))
            stage("verify", lambda: self._verify_tree(b, bk.out["tree_compile"]))
            stage("walk", lambda: self._walk(bk, bk.out["tree_build"], bk.out["tree_compile"]))
            stage("commit", lambda: self._commit_tree(bk, bk.out["walk"], bk.out["verify"]), idempotent=False)
        else:
            stage("verify", lambda: self._verify_ar(b))
            stage("commit", lambda: self._commit_ar(b), idempotent=False)
        return bk

    def _batch_builder(self):
        """The tree builder of batched DDTree rounds, looked for once per loop: the slotted Triton kernel
        builders.batched_kernel names where it passes builders.checked_slotted here (at max_batch slots, in the
        rounds' dtype; on CUDA), else the exact batched builder."""
        if not self._slotted_looked:
            self._slotted_looked = True
            kernel = builders.batched_kernel(self.budget, self.tree_kernel)
            if kernel != "torch":
                self._slotted = builders.checked_slotted(self.L, self.target.cfg.vocab_size, self.budget, self.max_batch,
                                                         self.device, self.dtype, exact=self.builder, kernel=kernel)
        return self._slotted if self._slotted is not None else self.builder

    def _draft(self, b: int) -> None:
        """ONE DFlash draft over slots 0..b-1: blocks [bonus_i, mask...] at start_i, context rows ctx_i at ctx_start_i."""
        d, bs, S = self.drafter, self.block_size, self.capacity
        block = torch.cat([self.bonus[:b, None], self.mask_tail[None, :].expand(b, bs - 1)], dim=1).reshape(-1)
        emb = self.target.embed(block)
        made: dict[int, torch.Tensor] = {}
        biases = []
        for l, kind in enumerate(self.draft_kind):
            if kind not in made:
                made[kind] = visible_bias(draft_visible(d, l, self.start[:b], bs, S), self.dtype, self.dgroup)
            biases.append(made[kind])
        ctx = self.ctx[:b].reshape(b * bs, -1)
        h = draft_forward_batch(d, ctx, emb, self.dk[:, :b], self.dv[:, :b], self.ctx_start[:b], self.start[:b],
                                biases, self.ops)
        self.dlogits[:b].copy_(self.target.lm_head(h.view(b, bs, -1)[:, 1:]))

    def _build(self, b: int, builder) -> BatchTrees:
        """Every slot's non-root nodes [b, N]: tokens, parents 1-based, depths."""
        if self.method == "dflash":   # tree_ops.chain per slot: the argmax chain
            toks = self.dlogits[:b].argmax(dim=-1)
            ar = torch.arange(self.L, device=self.device).expand(b, self.L)
            return BatchTrees(toks, ar.contiguous(), (ar + 1).contiguous())
        return builder(self.dlogits[:b])   # one batched build (the slotted kernel: one launch)

    def _compile(self, b: int, trees: BatchTrees):
        """Verify inputs of every slot: ids, positions [b*W], ancestor matrices [b, W, W], bias [b, g*W, S], and
        (the Triton compile) the path tables [b, W, L+1]."""
        dev, S = self.device, self.capacity
        if self.fused_tree_ops:
            from ddtree_bench.engine.gpu.kernels.tree_verify import compile_trees

            return compile_trees(self.bonus[:b], trees.token_ids, trees.parents, trees.depths, self.start[:b], S,
                                 self.dtype, self.tgroup, self.L)
        ids, pos, anc, bias = [], [], [], []
        zero = torch.zeros(1, dtype=torch.long, device=dev)
        for i, (tok, par, dep) in enumerate(trees.slots()):   # the twin: tree_ops per slot
            ids.append(torch.cat([self.bonus[i : i + 1], tok]))
            pos.append(self.start[i] + torch.cat([zero, dep]))
            a = ancestors(par, self.L)
            anc.append(a)
            bias.append(visible_bias(verify_visible(a, self.start[i], S), self.dtype, self.tgroup))
        return torch.cat(ids), torch.cat(pos), torch.stack(anc), torch.stack(bias), None

    def _verify_tree(self, b: int, compiled) -> tuple[torch.Tensor, torch.Tensor]:
        ids, pos, _, bias, path = compiled   # path: the Triton compile's tables (None from the twin): the tree kernel
        logits, hidden = target_forward_batch(self.target, ids, pos, self.tk[:, :b], self.tv[:, :b], self.start[:b], bias,
                                              self.layers, self.ops, tree_path=path)
        self.post[:b].copy_(self._argmax(logits).view(b, self.width))   # greedy picks; sampled slots overwrite
        return logits, hidden

    def _argmax(self, logits: torch.Tensor) -> torch.Tensor:
        if self.fused_tree_ops:
            from ddtree_bench.engine.gpu.kernels.argmax import argmax_rows

            return argmax_rows(logits)
        return logits.argmax(dim=-1)

    def _walk(self, bk: _Bucket, trees: BatchTrees, compiled) -> torch.Tensor:
        """Every slot's walk result [b, layout.size], with a guarded layout followed by the builder's certificate flag
        (one for all slots) in every row: [b, size + 1]."""
        b = bk.b
        ids, _, anc, _, path = compiled
        if path is not None:
            from ddtree_bench.engine.gpu.kernels.tree_verify import walk_trees

            walked = walk_trees(ids, trees.parents, trees.depths, path, self.post[:b], self.layout)
        else:
            W = self.width
            walked = torch.stack([walk_static(ids[i * W : (i + 1) * W], par, dep, anc[i], self.post[i], self.L)
                                  for i, (_, par, dep) in enumerate(trees.slots())])
        if bk.layout.guard:   # the flag rides along with the one transfer, and the commit reads it on the device
            walked = torch.cat([walked, bk.builder.flag.to(torch.long).expand(b, 1)], dim=1)
        return walked

    def _commit_tree(self, bk: _Bucket, walked: torch.Tensor, verified) -> None:
        """tree_ops.commit_static per slot (or its one-launch Triton twin); padding slots commit a = 0 (nothing
        moves, start stays); with a guarded layout a raised certificate flag makes every slot's commit a no-op."""
        b, layout = bk.b, bk.layout
        _, hidden = verified
        if self.fused_tree_ops:
            from ddtree_bench.engine.gpu.kernels.tree_verify import commit_trees

            commit_trees(walked, layout, self.start[:b], self.ctx_start[:b], self.bonus[:b], self.tk, self.tv, hidden,
                         self.ctx, self.live[:b])
            return
        W = self.width
        masked = torch.cat([walked[:, :1] * self.live[:b, None], walked[:, 1:]], dim=1)
        for i in range(b):
            commit_static(masked[i], layout, self.start[i], self.ctx_start[i], self.bonus[i : i + 1], self.tk[:, i],
                          self.tv[:, i], hidden[i * W : (i + 1) * W], self.ctx[i])

    def _verify_ar(self, b: int) -> tuple[torch.Tensor, None]:
        cols = torch.arange(self.capacity, device=self.device)
        bias = visible_bias(cols <= self.start[:b, None, None], self.dtype, self.tgroup)   # [b, g, S]
        logits, _ = target_forward_batch(self.target, self.bonus[:b], self.start[:b], self.tk[:, :b], self.tv[:, :b],
                                         self.start[:b], bias, ops=self.ops)
        self.post[:b].copy_(self._argmax(logits)[:, None])
        return logits, None

    def _commit_ar(self, b: int) -> None:
        live = self.live[:b]
        self.bonus[:b].copy_(torch.where(live > 0, self.post[:b, 0], self.bonus[:b]))
        self.start[:b].add_(live)

    # ------------------------------------------------------------------ one round

    def _run(self, bk: _Bucket, name: str, laps: Laps | None) -> None:
        bk.out[name] = bk.stages[name].run()
        if laps is not None:
            laps.mark(name)

    def _propose(self, b: int) -> None:
        """A host-side proposer's draft per slot (batched when it has `propose_batch`), into dlogits."""
        rows = []
        for st in self.active:
            ctx = st.prefill_hidden if st.prefill_hidden is not None else self.ctx[st.slot, : st.a]
            rows.append(ProposeRow(st.req.key, ctx, st.bonus, st.dcache, st.draft_len, st.start))
        p = self.proposer
        if hasattr(p, "propose_batch"):
            drafts = p.propose_batch(rows)
        else:
            drafts = [p.propose(r.ctx, r.bonus, r.cache, r.draft_len, r.start) for r in rows]
        for st, dl in zip(self.active, drafts):
            if dl.shape[0] != self.L:   # fixed shapes: a shorter draft (a draft_length variant) needs the plain loop
                raise ValueError(f"the batched fast loop needs drafts of {self.L} depths, the proposer gave {dl.shape[0]}")
            self.dlogits[st.slot].copy_(dl)

    def step(self, waiting: bool = False) -> list[Retired]:
        """One round over every active request; returns the requests that retired after it. `waiting`: requests wait
        for a free slot (AR then queues no round ahead, so that they join the next round, as in BatchLoop). Runs in
        inference mode, entered here unless the calling thread is in it already (the scheduler's engine thread
        enters it once; docs/gpu-performance.md has what that saves)."""
        if torch.is_inference_mode_enabled():
            return self._step(waiting)
        with torch.inference_mode():
            return self._step(waiting)

    def _step(self, waiting: bool) -> list[Retired]:
        if not self.active:
            return []
        if not self.spec:
            return self._ar_step(waiting)
        n = len(self.active)
        b = next(x for x in self.buckets if x >= n)
        self.stats.batch_sizes.append(n)
        for st in self.active:
            st.batch_sizes.append(n)
        rnd = self._solo_round(self.active[0]) if b == 1 and self.solo is not None else self._batched_round(b)
        self._finish_round(rnd, time.perf_counter_ns())
        self._time_later(rnd.laps, n, b, list(self.active))
        return self._retire()

    def _ar_step(self, waiting: bool) -> list[Retired]:
        """AR, pipelined: the next round's input is already on the device (each slot's bonus), so with two or more
        requests the round after the one being read is queued before the host waits - unless requests wait to be
        admitted, a request wants logit gaps (the verify logits must still be this round's when read), or no request
        may need it. The host then reads the oldest round in flight and finishes it for its requests still active: one
        that stopped meanwhile had its rows computed for nothing, as a padding slot's (a stop token cannot be
        foreseen; max_new_tokens can, and no round is queued past it). One request alone queues nothing before its
        round is read - a round queued ahead of its stop token would run for nothing and hold up the next admission's
        prefill - but once read, the round after it is queued before this one's token goes out (_lone_continues), as
        the single loop orders it (FastLoop.generate), so the GPU runs while the host emits - unless `lone_resumes`: a
        scheduler then hands that request back to the solo loop (resume_alone), which queues it there. A request
        admitted while a round is in flight joins the next one queued."""
        if not self._inflight:
            self._inflight.append(self._queue_ar())
        if (self.pipeline_ar and len(self._inflight) == 1 and len(self.active) >= 2 and not waiting
                and not any(st.req.return_logit_gaps for st in self.active)
                and any(_may_continue(st) for st in self.active)):
            self._inflight.append(self._queue_ar())
        q = self._inflight.popleft()
        res = q.ticket.take()
        now = time.perf_counter_ns()
        if self.pipeline_ar and not self._inflight and not self.lone_resumes and self._lone_continues(q, res, waiting):
            self._inflight.append(self._queue_ar(after=q.laps))
        if q.t_cold is not None:
            self.cold_s[q.bucket] = time.perf_counter() - q.t_cold
            cold_notice(f"ar batch {'1' if q.bucket == 1 else f'bucket {q.bucket}'}", self.cold_s[q.bucket], self.device)
        live = set(map(id, self.active))
        members = [(st, i) for st, i in q.members if id(st) in live]
        if members:
            n = len(members)
            self.stats.batch_sizes.append(n)
            self._finish_round(_Round(res, 1, None, q.logits, q.laps), now, members)
            for st, _ in members:
                st.batch_sizes.append(n)
            self._time_later(q.laps, n, q.bucket, [st for st, _ in members])
        done = self._retire()
        if not self.active:
            self._inflight.clear()   # rounds queued for requests that all stopped: nothing in them to read
        return done

    def _lone_continues(self, q: _Queued, res: list[int], waiting: bool) -> bool:
        """One request alone, its round `q` read (`res`): whether the round after it will run - its token is no stop
        id and max_new_tokens is not reached - so it may be queued before this round is finished. Not while requests
        wait for a slot (they join the next round) or when the round's logits must still be read (logit gaps)."""
        if waiting or len(self.active) != 1 or len(q.members) != 1:
            return False
        st, i = q.members[0]
        if st is not self.active[0] or st.req.return_logit_gaps:
            return False
        return res[i] not in st.stream.stops and _may_continue(st)

    def _queue_ar(self, after: Laps | None = None) -> _Queued:
        """Queue one AR round over every active request (a bucket of one: FastLoop's stages on slot 0) and the copy of
        its picks to the host; nothing waits. `after`: the marks of the round queued just before this one, with
        nothing on the stream between them (a lone request's next round): this round's first stage is timed from
        that round's last mark, as the single loop times its rounds, instead of from a mark of its own."""
        n = len(self.active)
        b = next(x for x in self.buckets if x >= n)
        laps = Laps(self.device, self.spent_events)
        laps.begin(after)
        t_cold = time.perf_counter()
        if b == 1 and self.solo is not None:
            st, fl = self.active[0], self.solo
            known = len(fl.buckets)
            fb = fl._bucket("ar", 0, st.req.temperature < GREEDY_EPS)
            fl._launch(fb, False, False, False, HostState(None, st.bonus, st.start), laps, st.req.temperature,
                       st.req.top_p, st.gen)
            cold, ticket, logits = len(fl.buckets) > known, fb.last, fb.out.verified.logits
        else:
            cold = b not in self._stages
            bk = self._bucket(b)
            self._tree_to_host(bk, laps)
            self._run(bk, "commit", laps)
            ticket, logits = self._last, bk.out["verify"][0]
        return _Queued([(st, st.slot) for st in self.active], b, ticket, laps, logits, t_cold if cold else None)

    def _solo_round(self, st: _Slot):
        """One DFlash / DDTree round of the only request (slot 0; AR: _ar_step) through FastLoop's stages: its draft
        (unless the last round queued it), build .. walk, the commit, the next draft queued ahead when another round
        may follow, then the wait for the walk result (and, on a failed tree certificate, FastLoop's exact redo)."""
        fl, dev = self.solo, self.device
        T, greedy = st.req.temperature, st.req.temperature < GREEDY_EPS
        t_cold, known = time.perf_counter(), len(fl.buckets)
        fb = fl._bucket(self.method, self.budget, greedy)
        drafted = self._ahead is not None and self._ahead_bucket == 1
        laps = self._ahead if drafted else None
        self._ahead = None
        if laps is None:
            laps = Laps(dev, self.spent_events)
            laps.mark("begin")
        first = st.prefill_hidden is not None   # round 1: FastLoop's eager draft from the whole prompt
        if first and self.drafter is not None:
            self.ctx_start[0].fill_(0)
        host = HostState(st.prefill_hidden, st.bonus, st.start, st.draft_len, st.a)
        fl._launch(fb, first, drafted, False, host, laps, T, st.req.top_p, st.gen)
        if (self.drafter is not None and not st.stream.stopped and len(st.stream.out) + 1 < st.req.max_new_tokens
                and not (first and fb.fallback is not None)):   # FastLoop's rule: its round-1 redo needs that draft
            nxt = Laps(dev, self.spent_events)   # the next round's draft, queued before the wait (opens that round)
            nxt.mark("begin")
            fl._queue_draft(fb, False, host, nxt)
            self._ahead, self._ahead_bucket = nxt, 1
        res = fl._result(fb)
        if len(fl.buckets) > known:
            self.cold_s[1] = time.perf_counter() - t_cold
            cold_notice(f"{self._what()} batch 1", self.cold_s[1], dev)
        done = fb
        if fb.layout.read(res).flagged:
            done, res = fl._redo(fb, T, st.req.top_p, st.gen)
            self._ahead = None   # the redo moved the state on: the queued draft is stale
        out = done.out
        tree_of = lambda i: (out.tree.tok, out.tree.par, out.tree.dep)  # noqa: E731
        return _Round(res, len(res), tree_of, out.verified.logits, laps)

    def _batched_round(self, b: int) -> _Round:
        """One DFlash / DDTree round over bucket b (AR: _ar_step) through the batched stages (module docstring): its
        draft (unless the round before queued it for this bucket), build .. walk, the commit, the next round's draft
        queued before the wait for the walk results (plain DFlash drafter, while a request may go on: `_queue_draft`),
        then the wait; a raised certificate flag (the slotted builder's) makes the round redone by the bucket's exact
        stages (_redo) before anything is committed."""
        drafted = self._ahead is not None and self._ahead_bucket == b
        laps = self._ahead if drafted else None
        self._ahead = None
        t_cold, cold = time.perf_counter(), b not in self._stages
        bk = self._bucket(b)
        if laps is None:
            laps = Laps(self.device, self.spent_events)
            laps.mark("begin")
        if not drafted:
            if self.drafter is not None:
                for st in self.active:   # a request's first round: its prompt's drafter context first
                    if st.prefill_hidden is not None:
                        self._draft_context(st.slot, st.prefill_hidden, st.start)
                self._run(bk, "draft", laps)
            else:
                self._propose(b)
                laps.mark("draft")
        drawn = self._tree_to_host(bk, laps)
        self._run(bk, "commit", laps)
        self._queue_draft(bk)
        res = self._result(bk)
        if cold:
            self.cold_s[b] = time.perf_counter() - t_cold
            cold_notice(f"{self._what()} batch bucket {b}", self.cold_s[b], self.device)
        done = bk
        if bk.fallback is not None and bk.layout.read(res[: bk.stride]).flagged:   # one flag for all slots
            done, res = self._redo(bk, drawn)
            self._ahead = None   # the redo moved the state on: the queued draft is stale
        trees = done.out.get("tree_build")
        tree_of = lambda i: trees.slot(i)  # noqa: E731
        return _Round(res, done.stride, tree_of, done.out["verify"][0], laps)

    def _queue_draft(self, bk: _Bucket) -> None:
        """The next round's draft over bucket bk.b, queued after this round's commit and before the host waits for
        its walk results, so the device drafts while the host reads, emits and retires (as the solo loop does): with
        the plain DFlash drafter, while some request may need another round. It drafts from the device state the
        commit left, so it is the next round's draft wherever that round runs over the same bucket with no request
        admitted (admit drops it; a retirement keeps it: _pack moves each slot's drafts, dlogits and drafter cache,
        with the slot, and the next bucket decides: another bucket drafts again). On a flagged round the commit
        changed nothing, so this draft is the round's own again, bit for bit, which the redo builds from; the redo's
        commit then makes it stale (dropped)."""
        if self.drafter is None or not any(not st.stream.stopped and len(st.stream.out) + 1 < st.req.max_new_tokens
                                           for st in self.active):
            return
        nxt = Laps(self.device, self.spent_events)   # its marks open the next round
        nxt.mark("begin")
        self._run(bk, "draft", nxt)
        self._ahead, self._ahead_bucket = nxt, bk.b

    def _tree_to_host(self, bk: _Bucket, laps: Laps | None) -> dict[int, torch.Tensor]:
        """Queue bk's tree build .. walk (after its draft), the sampled slots' draws and the copy of the walk results
        to the host (its ticket: `_last`). Returns, with a builder that can flag, the generator state each sampled
        request drew from (slot -> state), so that a redo draws the same."""
        b = bk.b
        if self.spec:
            self._run(bk, "tree_build", laps)
            self._run(bk, "tree_compile", laps)
        bk.out["verify"] = bk.stages["verify"].run()
        logits = bk.out["verify"][0]
        W = self.width
        drawn: dict[int, torch.Tensor] = {}
        for st in self.active:
            if st.req.temperature >= GREEDY_EPS:   # its own generator, its own rows: batch 1's draws
                i = st.slot
                if bk.fallback is not None:
                    drawn[i] = st.gen.get_state()
                self.post[i].copy_(pick(logits[i * W : (i + 1) * W], st.req.temperature, st.req.top_p, st.gen))
        if laps is not None:
            laps.mark("verify")
        if self.spec:
            bk.out["walk"] = bk.stages["walk"].run()
            result = bk.out["walk"]
        else:
            result = self.post[:b, :1]
        self._last = self.ring.put(result)
        if laps is not None:
            laps.mark("walk")
        return drawn

    def _result(self, bk: _Bucket) -> list[int]:
        """Wait for the walk results of the round queued last (not for the stages queued after it): bk.stride a slot."""
        return self._last.take()

    def _redo(self, bk: _Bucket, drawn: dict[int, torch.Tensor]) -> tuple[_Bucket, list[int]]:
        """A batched round whose slotted build raised its certificate flag (any slot), redone with the exact batched
        builder's stages: the queued commit saw the flag and kept every buffer as it was, so dlogits hold this round's
        drafts (the draft queued ahead recomputed them from that same state: _queue_draft). Each sampled request's generator goes back to the
        state its discarded draw started from, so the redo draws what an unflagged round draws. Returns the fallback
        bucket and its walk results (its commit queued and done)."""
        self._redone += 1
        bk.builder.flag.zero_()
        for st in self.active:
            if st.slot in drawn:
                st.gen.set_state(drawn[st.slot])
        done = bk.fallback
        self._tree_to_host(done, None)
        self._run(done, "commit", None)
        return done, self._result(done)

    def _what(self) -> str:
        return self.method + (f" B={self.budget}" if self.method == "ddtree" else "")

    def _finish_round(self, rnd: _Round, now: int, members: list[tuple[_Slot, int]] | None = None) -> None:
        """Per request of the round (`members`: request and its slot in the round; default every active one at its
        slot): read its walk result (it may end with the certificate flag, already acted on: not read), record the
        round, move its host state on, emit its tokens."""
        res, size, W, tree_of, logits = rnd.res, rnd.stride, self.width, rnd.tree_of, rnd.logits
        members = [(st, st.slot) for st in self.active] if members is None else members
        news = []
        for st, i in members:
            r = res[i * size : (i + 1) * size]
            if self.spec:
                walk = self.layout.read(r)
                a, toks, accepted = walk.a, walk.new_tokens, walk.accepted
                if st.trees is not None:
                    tok, par, dep = tree_of(i)
                    st.trees.append(RoundTrace(tok.tolist(), par.tolist(), dep.tolist(), accepted))
            else:
                a, toks, accepted = 1, [r[0]], [0]
            if st.req.return_logit_gaps:
                keep = torch.tensor(accepted, device=self.device) + i * W
                st.gaps.extend(logit_gaps(logits.index_select(0, keep)))
            st.accept_lengths.append(a)
            st.prefill_hidden = None
            st.draft_len, st.start, st.a, st.bonus = st.start, st.start + a, a, toks[-1]
            news.append(toks)
        for (st, _), toks in zip(members, news):
            st.emit(toks, now)

    # ------------------------------------------------------------------ offline

    run = BatchLoop.run   # every request to completion, admitting in order as slots free up (same contract)
