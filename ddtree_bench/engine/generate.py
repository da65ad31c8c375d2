"""AR, DFlash and DDTree generation loops over one target (+ one DFlash drafter), batch size 1.

A round (DFlash and DDTree, as the authors' code runs it):
  1. draft  - the drafter sees the new context features and the block [bonus, mask x 15] and
              gives per-depth logits [L, V] through the target's lm_head;
  2. tree   - DFlash: the argmax chain (a tree with one path); DDTree: the best-first tree of
              `budget` nodes (tree.py);
  3. verify - one target forward over [bonus, nodes...] at positions start + depth, with the
              ancestor-only mask over prefix + tree; the KV of all 1+N tokens lands in slots
              start.. of the preallocated cache;
  4. commit - walk the tree with the target's picks (verify.py), copy the accepted path's K/V down
              to slots start.. (cache.compact), hand its hidden states to the drafter as new
              context, and emit the accepted tokens plus the new bonus.
a_r = accepted nodes counting the root (the paper's acceptance length, bonus-counting convention).
Rounds follow the last-round rule (interface.wants_round): a round runs only while fewer than
max_new_tokens tokens are out and no stop token was produced - the authors' loop runs one more
round whose tokens all fall past max_new_tokens; here it does not, for every method alike - and a
first token that is a stop token still records one round, as the authors' loop does. The last
round is not shrunk, so per-round acceptance lengths match theirs; the output is cut at
max_new_tokens and after the first stop token (inclusive). A generated token
equal to the mask id is kept (z-lab fixed that bug; the DDTree reference still drops it).

AR decodes one token per forward and stops as soon as max_new_tokens are emitted.
`fast=False` runs the slow twins (heap tree build, row-copy ancestor mask, dict walk); both paths
emit the same tokens (tests/engine/test_lossless.py). Knows nothing of HTTP, text or files.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from ddtree_bench.engine.draft import DFlashDrafter
from ddtree_bench.engine.batch import BatchLoop
from ddtree_bench.engine.interface import (METHODS, STAGES, Generation, OutputStream, RoundTrace, check_context,
                                          context_limit, logit_gaps, wants_round)
from ddtree_bench.engine.model import Target
from ddtree_bench.engine.proposer import DFlashProposer
from ddtree_bench.engine.tree import build_tree, build_tree_fast, chain_tree, compile_tree, verify_mask
from ddtree_bench.engine.verify import pick, request_generator, walk, walk_fast

__all__ = ["Engine", "PlainLoop", "DFlashProposer", "Generation", "OutputStream", "RoundTrace", "METHODS", "STAGES"]


class _Clock:
    """Stage stopwatch; synchronises CUDA so a stage's time is its own (the authors do the same)."""

    def __init__(self, device: torch.device, sync: bool):
        self.sync = sync and device.type == "cuda"
        self.totals = {s: 0 for s in STAGES}
        self.t = time.perf_counter_ns()

    def lap(self, stage: str) -> int:
        if self.sync:
            torch.cuda.synchronize()
        now = time.perf_counter_ns()
        self.totals[stage] += now - self.t
        self.t = now
        return now


class PlainLoop:
    """The reference loop over one target and an optional proposer, with caches sized to the longest
    request seen. `fast` picks the vectorised twins (GPU tree build, tensor walk) or the slow ones."""

    def __init__(self, target: Target, proposer=None, fast: bool | None = None, sync_stages: bool = True):
        self.target, self.proposer = target, proposer
        self.device = target.lm_head.weight.device
        # build_tree_fast: vectorised on GPUs; on CPUs the heap over lazily loaded exact top ranks
        # (tree_cpu), which never sorts the vocabulary as build_tree does (docs/gpu-performance.md).
        self.fast_walk = True if fast is None else fast
        self.fast_build = True if fast is None else fast
        self.sync_stages = sync_stages
        self._tcache = self._dcache = None

    @property
    def block_size(self) -> int:
        return self.proposer.block_size if self.proposer is not None else 1

    def _caches(self, capacity: int):
        if self._tcache is None or self._tcache.capacity < capacity:
            self._tcache = self.target.new_cache(capacity)
            if self.proposer is not None:
                self._dcache = self.proposer.new_cache(capacity)
        return self._tcache, self._dcache

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], method: str, budget: int, max_new_tokens: int, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int | None = None, stop_ids=(), on_chunk: Callable[[list[int]], None] | None = None,
                 record_trees: bool = False, return_logit_gaps: bool = False) -> Generation:
        dev = self.device
        P = len(prompt_ids)
        gen = request_generator(dev, temperature, seed)
        spec = method != "ar"
        width = 1 + (budget if method == "ddtree" else self.block_size - 1) if spec else 1
        tcache, dcache = self._caches(P + max_new_tokens + max(width, self.block_size) + 1)
        layers = self.proposer.target_layer_ids if spec else ()

        clock = _Clock(dev, self.sync_stages)
        t_start = clock.t
        gaps: list[float] = []  # one per token produced (before truncation), aligned with the emitted stream
        stream = OutputStream(max_new_tokens, stop_ids, on_chunk)
        emit = stream.emit

        # prefill: the first token is the target's own pick
        ids = torch.tensor(prompt_ids, dtype=torch.long, device=dev)
        logits, ctx = self.target(ids, torch.arange(P, device=dev), tcache, 0, hidden_layers=layers, last_logits_only=True)
        bonus = int(pick(logits, temperature, top_p, gen)[0])
        if return_logit_gaps:
            gaps.extend(logit_gaps(logits))
        t_first = clock.lap("prefill")
        emit([bonus], t_first)

        accept_lengths: list[int] = []
        trees: list[RoundTrace] | None = [] if record_trees else None
        start, draft_len = P, 0  # target cache frontier (the bonus sits at `start`), drafter frontier
        while wants_round(len(stream.out), stream.stopped, len(accept_lengths), max_new_tokens, spec):
            if not spec:
                logits, _ = self.target(torch.tensor([bonus], device=dev), torch.tensor([start], device=dev), tcache, start, mask=None)
                clock.lap("verify")
                bonus = int(pick(logits, temperature, top_p, gen)[0])
                if return_logit_gaps:
                    gaps.extend(logit_gaps(logits))
                start += 1
                accept_lengths.append(1)
                emit([bonus], clock.lap("commit"))
                continue

            # 1. draft: [bonus, mask, ..., mask] at positions start..start+bs-1
            draft_logits = self.proposer.propose(ctx, bonus, dcache, draft_len, start)  # [L, V]
            draft_len = start
            clock.lap("draft")

            # 2. tree
            if method == "dflash":
                tree = chain_tree(draft_logits.argmax(dim=-1))
            elif self.fast_build:
                tree = build_tree_fast(draft_logits, budget)
            else:
                tree = build_tree(draft_logits, budget).to(dev)
            vids, vpos, anc = compile_tree(tree, bonus, start, fast=self.fast_walk)
            mask = verify_mask(anc, start)
            clock.lap("tree_build")

            # 3. verify
            logits, hidden = self.target(vids, vpos, tcache, start, mask=mask, hidden_layers=layers)
            post = pick(logits, temperature, top_p, gen)
            clock.lap("verify")

            # 4. walk + commit
            if self.fast_walk:
                accepted, new_bonus = walk_fast(tree, anc, post)
            else:
                accepted, new_bonus = walk(tree, bonus, post.tolist())
            a = len(accepted)
            tcache.commit(start, accepted)
            keep = torch.tensor(accepted, device=dev)
            ctx = hidden[keep]
            if return_logit_gaps:  # each emitted token was picked from its parent's row
                gaps.extend(logit_gaps(logits[keep]))
            new_tokens = vids[keep[1:]].tolist() + [new_bonus]
            accept_lengths.append(a)
            if trees is not None:
                trees.append(RoundTrace(tree.token_ids.tolist(), tree.parents.tolist(), tree.depths.tolist(), accepted))
            start += a
            bonus = new_bonus
            emit(new_tokens, clock.lap("commit"))

        out = stream.out
        return Generation(
            output_ids=out,
            accept_lengths=accept_lengths,
            finish_reason=stream.finish_reason,
            num_prompt_tokens=P,
            stage_ns=dict(clock.totals),
            t_start_ns=t_start,
            t_first_token_ns=t_first,
            t_done_ns=time.perf_counter_ns(),
            chunk_times_ns=stream.chunk_times_ns,
            chunk_tokens=stream.chunk_tokens,
            trees=trees,
            logit_gaps=gaps[: len(out)] if return_logit_gaps else None,
        )


class Engine:
    """One target, an optional DFlash drafter (or any proposer): checks a request and hands it to the
    reference loop (PlainLoop) or, with cuda_graphs, to the GPU loop (gpu.loop.FastLoop: fixed
    shapes, CUDA graphs, one sync a round; on a CPU the same fixed-shape code without capture).
    Both emit the same tokens."""

    def __init__(self, target: Target, drafter: DFlashDrafter | None = None, fast: bool | None = None, sync_stages: bool = True,
                 proposer=None, cuda_graphs: bool = False):
        if cuda_graphs and getattr(target, "is_hybrid", False):
            from ddtree_bench.errors import UsageError

            raise UsageError(f"--cuda-graphs does not run hybrid / MoE targets ({target.cfg.model_type}) yet",
                             hint="drop --cuda-graphs: the plain loop runs them on CUDA (docs/hybrid-targets.md)")
        self.target = target.eval()
        self.drafter = drafter.eval() if drafter is not None else None
        self.proposer = proposer if proposer is not None else (DFlashProposer(self.drafter, self.target) if drafter is not None else None)
        self.device = target.lm_head.weight.device
        self.plain = PlainLoop(self.target, self.proposer, fast, sync_stages)
        self.cuda_graphs = cuda_graphs
        self._fast_loop = None

    @property
    def block_size(self) -> int:
        return self.plain.block_size

    @property
    def _tcache(self):
        """The reference loop's target cache (tests read it)."""
        return self.plain._tcache

    def fast_loop(self):
        """The FastLoop behind cuda_graphs=True (made on first use; holds its own caches and graphs)."""
        if self._fast_loop is None:
            from ddtree_bench.engine.gpu.loop import FastLoop

            self._fast_loop = FastLoop(self.target, self.proposer)
        return self._fast_loop

    def batch_loop(self, method: str, budget: int, max_batch: int):
        """The batched loop for this engine: with cuda_graphs the batched fast loop
        (gpu/batch_loop.BatchFastLoop) where it supports the method and budget (DDTree needs budget > 0),
        else the reference BatchLoop with the plain loop's walk/build settings. Either has `.kind`
        ("fast" | "plain"); the dispatch is here so the reference half reaches into gpu/ only
        through Engine."""
        if self.cuda_graphs and (method != "ddtree" or budget > 0):
            from ddtree_bench.engine.gpu.batch_loop import BatchFastLoop

            return BatchFastLoop(self.target, self.proposer, method, budget, max_batch)
        plain = self.plain
        fast = None if plain.fast_walk and plain.fast_build else plain.fast_walk   # None: the default choice
        return BatchLoop(self.target, self.proposer, method, budget, max_batch, fast=fast, sync_stages=plain.sync_stages)

    def generate(
        self,
        prompt_ids: list[int],
        method: str = "ddtree",
        budget: int = 64,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop_ids: list[int] | tuple[int, ...] = (),
        on_chunk: Callable[[list[int]], None] | None = None,
        record_trees: bool = False,
        return_logit_gaps: bool = False,
    ) -> Generation:
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}")
        if method != "ar" and self.proposer is None:
            raise ValueError(f"method {method!r} needs a drafter")
        if not prompt_ids:
            raise ValueError("empty prompt")
        if max_new_tokens <= 0:
            raise ValueError("max_new_tokens must be positive")
        check_context(len(prompt_ids), max_new_tokens, context_limit(self.target))
        loop = self.fast_loop() if self.cuda_graphs and self.fast_loop().supports(method, budget) else self.plain
        return loop.generate(prompt_ids, method, budget, max_new_tokens, temperature, top_p, seed, stop_ids,
                             on_chunk, record_trees, return_logit_gaps)
