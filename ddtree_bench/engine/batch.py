"""Continuous batching in the reference engine: the batched plain loop, the slow obvious twin.

`BatchLoop` keeps up to `max_batch` requests in flight for one method and one budget. A request
is admitted between rounds: its prefill runs alone (the same call batch 1 makes, on a KV cache of
its own) and emits its first token. Then every round, over all active requests at once:
  1. draft  - one drafter forward over every request's new context and block
              (batch_forward.drafter_forward_batch; a proposer without a batched form is called
              once per request: tests' rigged proposers);
  2. tree   - each request's own tree (DFlash: its argmax chain; DDTree: its best-first tree of
              `budget` nodes), compiled to verify ids, positions and its ancestor-only mask;
  3. verify - ONE target forward over the concatenation of all trees
              (batch_forward.target_forward_batch): weights once over all tokens, attention per
              request over its own cache region, so each request's nodes see only its own
              committed prefix and its own ancestors;
  4. commit - per request: the target's picks, the walk, KV compaction in its own cache, the
              accepted path's hidden states as its next drafter context, the emitted tokens.
AR batches the same way (one token per request per forward). After the round, requests that
`interface.wants_round` would not run again retire (their `Generation` is final) and waiting
requests take their places. Per request everything follows `generate.PlainLoop` exactly: the
last-round rule, the output cut, a_r counting the root, stop ids, max_new_tokens, temperature,
top_p, trees and logit gaps.

Seeds: each request owns its own `torch.Generator` on the engine's device, seeded with the
request's `seed` (0 when None) exactly as `PlainLoop.generate` seeds its generator, and every
sample the request draws (the prefill's token, then one `pick` over its own verify rows each
round) is drawn from that generator alone, in the order batch 1 draws them. So a request draws the
same samples batched as alone, whoever shares its batch: T > 0 outputs equal batch 1 token for
token (and are exact in distribution, by sample-and-match).

Timing: a request's `t_start_ns` is its admission (the wait before it is in the caller's TTFT);
its stage_ns sums its own prefill plus the whole batch's time of every stage of the rounds it took
part in (what it waited for). Other requests' prefills between its rounds appear in its e2e only.
`stats` counts rounds and how full each was (batch size per round).

The batched fast loop (gpu/batch_loop.BatchFastLoop: fixed shapes, CUDA graphs) is tested against
this one; `Engine.batch_loop` picks it for engines with cuda_graphs. Knows nothing of threads or HTTP (batch_scheduler.py feeds it from callers).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ddtree_bench.engine.batch_forward import DraftRow, TargetRow, drafter_forward_batch, target_forward_batch
from ddtree_bench.engine.cache import KVCache
from ddtree_bench.engine.interface import (METHODS, STAGES, Generation, OutputStream, RoundTrace, check_context,
                                          context_limit, logit_gaps, wants_round)
from ddtree_bench.engine.model import Target
from ddtree_bench.engine.proposer import DFlashProposer
from ddtree_bench.engine.tree import build_tree, build_tree_fast, chain_tree, compile_tree, verify_mask
from ddtree_bench.engine.verify import pick, request_generator, walk, walk_fast


@dataclass
class BatchRequest:
    """One request for a batch. `key` is handed to a batched proposer (`propose_batch`) with the
    request's draft row, so a rigged proposer can tell requests apart; `cancelled`, when given, is
    polled between rounds (True: the request retires with `Cancelled`)."""

    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_ids: Sequence[int] = ()
    on_chunk: Callable[[list[int]], None] | None = None
    record_trees: bool = False
    return_logit_gaps: bool = False
    key: Any = None
    cancelled: Callable[[], bool] | None = None


@dataclass
class BatchGeneration(Generation):
    """A Generation plus the batch size of every round the request took part in (`batch_sizes[r]`
    requests shared round r; all 1 alone)."""

    batch_sizes: list[int] = field(default_factory=list)


@dataclass
class ProposeRow:
    """What a batched proposer (`propose_batch(rows) -> [draft logits [L, V] per row]`) gets per
    request: its key, then exactly `Proposer.propose`'s arguments."""

    key: Any
    ctx: torch.Tensor
    bonus: int
    cache: Any
    draft_len: int
    start: int


class Cancelled(Exception):
    """The request's `cancelled()` said so; it left the batch between rounds."""


@dataclass
class BatchStats:
    """How full the batch was: one entry per round that ran (its number of requests)."""

    max_batch: int
    batch_sizes: list[int] = field(default_factory=list)
    admitted: int = 0

    @property
    def rounds(self) -> int:
        return len(self.batch_sizes)

    @property
    def mean_batch_size(self) -> float | None:
        return sum(self.batch_sizes) / len(self.batch_sizes) if self.batch_sizes else None

    @property
    def max_batch_size(self) -> int | None:
        return max(self.batch_sizes) if self.batch_sizes else None

    def to_dict(self) -> dict[str, Any]:
        return {"max_batch": self.max_batch, "rounds": self.rounds, "batch_size_mean": self.mean_batch_size,
                "batch_size_max": self.max_batch_size, "admitted": self.admitted}


@dataclass(eq=False)
class _Active:
    """A request in flight: its caches, generator, stream and loop state (PlainLoop's locals)."""

    req: BatchRequest
    tcache: KVCache
    dcache: Any
    gen: torch.Generator | None
    stream: OutputStream
    t_start: int
    t_first: int = 0
    bonus: int = 0
    ctx: torch.Tensor | None = None
    start: int = 0
    draft_len: int = 0
    accept_lengths: list[int] = field(default_factory=list)
    trees: list[RoundTrace] | None = None
    gaps: list[float] = field(default_factory=list)
    stage_ns: dict[str, int] = field(default_factory=lambda: {s: 0 for s in STAGES})
    batch_sizes: list[int] = field(default_factory=list)
    error: BaseException | None = None

    def emit(self, tokens: list[int], now: int) -> None:
        try:
            self.stream.emit(tokens, now)
        except Exception as e:  # the caller's on_chunk (e.g. a client that went away): only this request ends
            self.error = e

    def generation(self, t_done_ns: int | None = None) -> BatchGeneration:
        """The request's Generation; t_done_ns (default now) is when its last token went out."""
        out = self.stream.out
        t_done_ns = time.perf_counter_ns() if t_done_ns is None else t_done_ns
        return BatchGeneration(
            output_ids=out, accept_lengths=self.accept_lengths, finish_reason=self.stream.finish_reason,
            num_prompt_tokens=len(self.req.prompt_ids), stage_ns=dict(self.stage_ns), t_start_ns=self.t_start,
            t_first_token_ns=self.t_first, t_done_ns=t_done_ns, chunk_times_ns=self.stream.chunk_times_ns,
            chunk_tokens=self.stream.chunk_tokens, trees=self.trees,
            logit_gaps=self.gaps[: len(out)] if self.req.return_logit_gaps else None, batch_sizes=self.batch_sizes,
        )


@dataclass
class Retired:
    """A request that left the batch: its Generation, or the error that ended it."""

    request: BatchRequest
    generation: Generation | None
    error: BaseException | None = None


def retirement(st: _Active, speculative: bool) -> Retired | None:
    """What retires a request after a round, the same rule in both batched loops: a cancellation
    (checked here) or an error retires it with that error, a request that `interface.wants_round`
    would not run again retires it with its final Generation; None keeps it."""
    if st.error is None and st.req.cancelled is not None and st.req.cancelled():
        st.error = Cancelled()
    if st.error is not None:
        return Retired(st.req, None, st.error)
    if not wants_round(len(st.stream.out), st.stream.stopped, len(st.accept_lengths), st.req.max_new_tokens, speculative):
        return Retired(st.req, st.generation())
    return None


def split_retired(active: Sequence[_Active], speculative: bool, only: Iterable[_Active] | None = None
                  ) -> tuple[list[tuple[_Active, Retired]], list[_Active]]:
    """`active` after a round: the (state, Retired) pairs that `retirement` retires and the states
    kept, in order. With `only`, only those states are asked; the rest are kept."""
    only = None if only is None else list(only)
    out, keep = [], []
    for st in active:
        done = retirement(st, speculative) if only is None or st in only else None
        if done is None:
            keep.append(st)
        else:
            out.append((st, done))
    return out, keep


class BatchLoop:
    """The batched plain loop (module docstring). `fast` picks the vectorised tree build and walk
    as `PlainLoop` does (None: vectorised walk; vectorised build on CUDA only)."""

    kind = "plain"   # which batched loop ran (run.json / summary.json say it)
    can_run_alone = False   # no single-loop path for a lone request (the fast twin's run_alone); every round is batched

    def __init__(self, target: Target, proposer, method: str, budget: int, max_batch: int, fast: bool | None = None,
                 sync_stages: bool = True):
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}")
        if method != "ar" and proposer is None:
            raise ValueError(f"method {method!r} needs a drafter")
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.target, self.proposer = target, proposer
        self.method, self.budget, self.max_batch = method, budget, max_batch
        self.spec = method != "ar"
        self.device = target.lm_head.weight.device
        self.fast_walk = True if fast is None else fast
        self.fast_build = True if fast is None else fast   # as PlainLoop: build_tree_fast on every device
        self.sync = sync_stages and self.device.type == "cuda"
        self.layers = tuple(proposer.target_layer_ids) if self.spec else ()
        self.block_size = proposer.block_size if self.spec else 1
        self.active: list[_Active] = []
        self.stats = BatchStats(max_batch)
        self._free: list[tuple[KVCache, Any]] = []  # caches of retired requests, reused

    # ------------------------------------------------------------------ admission

    def check(self, req: BatchRequest) -> None:
        """The checks `Engine.generate` makes (ValueError)."""
        if not req.prompt_ids:
            raise ValueError("empty prompt")
        if req.max_new_tokens <= 0:
            raise ValueError("max_new_tokens must be positive")
        check_context(len(req.prompt_ids), req.max_new_tokens, context_limit(self.target))

    @property
    def free_slots(self) -> int:
        return self.max_batch - len(self.active)

    def _caches(self, capacity: int):
        for i, (tc, dc) in enumerate(self._free):
            if tc.capacity >= capacity:
                return self._free.pop(i)
        return self.target.new_cache(capacity), (self.proposer.new_cache(capacity) if self.spec else None)

    def _now(self) -> int:
        if self.sync:
            torch.cuda.synchronize()
        return time.perf_counter_ns()

    @torch.inference_mode()
    def admit(self, req: BatchRequest) -> Retired | None:
        """Prefill `req` alone and add it to the batch (needs a free slot). Returns its Retired at once
        when it needs no round (max_new_tokens = 1, AR's first token a stop, an on_chunk error)."""
        self.check(req)
        if self.free_slots <= 0:
            raise RuntimeError("no free slot in the batch")
        dev = self.device
        P = len(req.prompt_ids)
        gen = request_generator(dev, req.temperature, req.seed)
        width = 1 + (self.budget if self.method == "ddtree" else self.block_size - 1) if self.spec else 1
        tcache, dcache = self._caches(P + req.max_new_tokens + max(width, self.block_size) + 1)
        t0 = self._now()
        st = _Active(req, tcache, dcache, gen, OutputStream(req.max_new_tokens, req.stop_ids, req.on_chunk), t0,
                     trees=[] if req.record_trees else None)
        ids = torch.tensor(req.prompt_ids, dtype=torch.long, device=dev)
        logits, ctx = self.target(ids, torch.arange(P, device=dev), tcache, 0, hidden_layers=self.layers, last_logits_only=True)
        st.bonus = int(pick(logits, req.temperature, req.top_p, gen)[0])
        if req.return_logit_gaps:
            st.gaps.extend(logit_gaps(logits))
        st.t_first = self._now()
        st.stage_ns["prefill"] += st.t_first - t0
        st.ctx, st.start, st.draft_len = ctx, P, 0
        st.emit([st.bonus], st.t_first)
        self.stats.admitted += 1
        self.active.append(st)
        done = self._retire(only=[st])
        return done[0] if done else None

    # ------------------------------------------------------------------ rounds

    def _retire(self, only: Iterable[_Active] | None = None) -> list[Retired]:
        retired, self.active = split_retired(self.active, self.spec, only)
        self._free.extend((st.tcache, st.dcache) for st, _ in retired)
        del self._free[: max(0, len(self._free) - self.max_batch)]  # keep at most one batch of spare caches
        return [done for _, done in retired]

    def _lap(self, stage: str, t: int) -> int:
        now = self._now()
        for st in self.active:
            st.stage_ns[stage] += now - t
        return now

    def fail_all(self, error: BaseException) -> list[Retired]:
        """End every active request with `error` (a round that raised: its state is unknown)."""
        out = [Retired(st.req, None, error) for st in self.active]
        self.active = []
        return out

    @torch.inference_mode()
    def step(self, waiting: bool = False) -> list[Retired]:
        """One round over every active request; returns the requests that retired after it. (`waiting`, whether
        requests wait for a slot, is for the fast twin's AR pipelining; this loop runs one round at a time.)"""
        if not self.active:
            return []
        n = len(self.active)
        self.stats.batch_sizes.append(n)
        for st in self.active:
            st.batch_sizes.append(n)
        t = self._now()
        if self.spec:
            self._spec_round(t)
        else:
            self._ar_round(t)
        return self._retire()

    def _ar_round(self, t: int) -> None:
        dev = self.device
        rows = [TargetRow(torch.tensor([st.bonus], device=dev), torch.tensor([st.start], device=dev), st.tcache, st.start, None)
                for st in self.active]
        outs = target_forward_batch(self.target, rows)
        t = self._lap("verify", t)
        news = []
        for st, (logits, _) in zip(self.active, outs):
            st.bonus = int(pick(logits, st.req.temperature, st.req.top_p, st.gen)[0])
            if st.req.return_logit_gaps:
                st.gaps.extend(logit_gaps(logits))
            st.start += 1
            st.accept_lengths.append(1)
            news.append([st.bonus])
        now = self._lap("commit", t)
        for st, toks in zip(self.active, news):
            st.emit(toks, now)

    def _propose(self) -> list[torch.Tensor]:
        p = self.proposer
        if hasattr(p, "propose_batch"):
            return p.propose_batch([ProposeRow(st.req.key, st.ctx, st.bonus, st.dcache, st.draft_len, st.start) for st in self.active])
        if type(p) is DFlashProposer:  # one drafter forward for the whole batch
            dev = self.device
            rows = []
            for st in self.active:
                block = torch.full((p.block_size,), p.drafter.mask_token_id, dtype=torch.long, device=dev)
                block[0] = st.bonus
                rows.append(DraftRow(st.ctx, block, st.dcache, st.draft_len, st.start))
            hs = drafter_forward_batch(p.drafter, p.target.embed, rows)
            logits = p.target.lm_head(torch.cat([h[1:] for h in hs]))
            L = p.block_size - 1
            return [logits[i * L:(i + 1) * L] for i in range(len(hs))]
        return [p.propose(st.ctx, st.bonus, st.dcache, st.draft_len, st.start) for st in self.active]

    def _spec_round(self, t: int) -> None:
        dev = self.device
        # 1. draft
        drafts = self._propose()
        for st in self.active:
            st.draft_len = st.start
        t = self._lap("draft", t)
        # 2. trees
        built = []
        for st, dl in zip(self.active, drafts):
            if self.method == "dflash":
                tree = chain_tree(dl.argmax(dim=-1))
            elif self.fast_build:
                tree = build_tree_fast(dl, self.budget)
            else:
                tree = build_tree(dl, self.budget).to(dev)
            vids, vpos, anc = compile_tree(tree, st.bonus, st.start, fast=self.fast_walk)
            built.append((tree, vids, vpos, anc, verify_mask(anc, st.start)))
        t = self._lap("tree_build", t)
        # 3. verify: one target forward over all trees
        outs = target_forward_batch(self.target, [TargetRow(vids, vpos, st.tcache, st.start, mask)
                                                  for st, (_, vids, vpos, _, mask) in zip(self.active, built)], self.layers)
        posts = [pick(logits, st.req.temperature, st.req.top_p, st.gen) for st, (logits, _) in zip(self.active, outs)]
        t = self._lap("verify", t)
        # 4. walk + commit, per request
        news = []
        for st, (tree, vids, _, anc, _), (logits, hidden), post in zip(self.active, built, outs, posts):
            if self.fast_walk:
                accepted, new_bonus = walk_fast(tree, anc, post)
            else:
                accepted, new_bonus = walk(tree, st.bonus, post.tolist())
            a = len(accepted)
            st.tcache.commit(st.start, accepted)
            keep = torch.tensor(accepted, device=dev)
            st.ctx = hidden[keep]
            if st.req.return_logit_gaps:
                st.gaps.extend(logit_gaps(logits[keep]))
            news.append(vids[keep[1:]].tolist() + [new_bonus])
            st.accept_lengths.append(a)
            if st.trees is not None:
                st.trees.append(RoundTrace(tree.token_ids.tolist(), tree.parents.tolist(), tree.depths.tolist(), accepted))
            st.start += a
            st.bonus = new_bonus
        now = self._lap("commit", t)
        for st, toks in zip(self.active, news):
            st.emit(toks, now)

    # ------------------------------------------------------------------ offline

    @torch.inference_mode()   # once for the whole run: the fast loop's step then skips entering it every round
    def run(self, requests: Sequence[BatchRequest]) -> list[Generation]:
        """Every request to completion, admitting in order as slots free up; results in request
        order. The first request error is raised after the batch drains."""
        waiting = deque(enumerate(requests))
        results: dict[int, Retired] = {}
        index = {}
        while waiting or self.active:
            while waiting and self.free_slots > 0:
                i, r = waiting.popleft()
                index[id(r)] = i
                done = self.admit(r)
                if done is not None:
                    results[i] = done
            for done in self.step(waiting=bool(waiting)):
                results[index[id(done.request)]] = done
        for i in range(len(requests)):
            if results[i].error is not None:
                raise results[i].error
        return [results[i].generation for i in range(len(requests))]
