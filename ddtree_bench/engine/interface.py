"""What both halves of the engine share: the generation result, the output stream, the round trace,
the proposer protocol, the walk-result layout and the last-round rule.

The reference loop (generate.py) and the GPU loop (gpu/loop.py) both import this module and
nothing of each other's, so neither half can reach into the other. It knows token ids and tensors;
it knows nothing of models, trees, caches, graphs or HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch

METHODS = ("ar", "dflash", "ddtree")
STAGES = ("prefill", "draft", "tree_build", "verify", "commit")
# the GPU loop's timed stages of one round (gpu/loop.py fills them; perf/ reads them without importing the GPU path)
ROUND_STAGES = ("draft", "tree_build", "tree_compile", "verify", "walk", "commit")


class ContextTooLong(ValueError):
    """A request whose prompt plus max_new_tokens does not fit the target's context (max_position_embeddings)."""


def context_limit(target: Any) -> int | None:
    """The target's context in tokens (its config's max_position_embeddings), None where it names none."""
    return getattr(getattr(target, "cfg", None), "max_position_embeddings", None)


def check_context(n_prompt: int, max_new_tokens: int, limit: int | None) -> None:
    """ContextTooLong when n_prompt + max_new_tokens > limit: positions the target was not built for (a server
    answers such a request 400, so a reference or baseline made there could never be met)."""
    if limit and n_prompt + max_new_tokens > limit:
        raise ContextTooLong(f"prompt ({n_prompt} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's "
                             f"context of {limit} tokens")


@dataclass
class RoundTrace:
    """One DDTree/DFlash round, for debugging and plots: the tree and which nodes were accepted."""

    token_ids: list[int]
    parents: list[int]
    depths: list[int]
    accepted: list[int]


@dataclass
class Generation:
    output_ids: list[int]                 # generated tokens only, cut at stop / max_new_tokens
    accept_lengths: list[int]             # a_r per verify round that ran (root counted); all 1 for AR
    finish_reason: str                    # "stop" | "length"
    num_prompt_tokens: int
    stage_ns: dict[str, int]              # totals per stage
    t_start_ns: int
    t_first_token_ns: int
    t_done_ns: int
    chunk_times_ns: list[int] = field(default_factory=list)   # when each chunk of tokens was emitted
    chunk_tokens: list[int] = field(default_factory=list)     # how many tokens each chunk carried
    trees: list[RoundTrace] | None = None
    logit_gaps: list[float] | None = None  # per output token: target top-1 minus top-2 logit where it was picked


class OutputStream:
    """The generated tokens as the caller sees them: cut at max_new_tokens and after the first stop
    token (inclusive), each chunk's emission time and size, forwarded to an optional callback.
    `stopped` is set once any round produced a stop token (anywhere in its tokens, as the authors
    check), which ends generation even when the stop falls beyond max_new_tokens."""

    def __init__(self, max_new_tokens: int, stop_ids, on_chunk: Callable[[list[int]], None] | None = None):
        self.max_new_tokens = max_new_tokens
        self.stops = set(int(s) for s in stop_ids)
        self.on_chunk = on_chunk
        self.out: list[int] = []
        self.chunk_times_ns: list[int] = []
        self.chunk_tokens: list[int] = []
        self.stopped = False

    def visible(self, tokens: list[int]) -> list[int]:
        """The part of `tokens` that `emit` would append (nothing once a stop token was produced)."""
        if self.stopped:
            return []
        take = tokens[: max(0, self.max_new_tokens - len(self.out))]
        for i, t in enumerate(take):
            if t in self.stops:
                return take[: i + 1]
        return take

    def emit(self, tokens: list[int], now_ns: int) -> None:
        take = self.visible(tokens)
        self.stopped = self.stopped or any(t in self.stops for t in tokens)
        if take:
            self.out.extend(take)
            self.chunk_times_ns.append(now_ns)
            self.chunk_tokens.append(len(take))
            if self.on_chunk is not None:
                self.on_chunk(take)

    @property
    def finish_reason(self) -> str:
        return "stop" if self.out and self.out[-1] in self.stops else "length"


def wants_round(emitted: int, stopped: bool, rounds_ran: int, max_new_tokens: int, speculative: bool) -> bool:
    """The last-round rule, one for every method: another round runs only if some of its tokens can
    be emitted - fewer than max_new_tokens tokens are out (every round emits at least one) and no
    stop token was produced. One exception keeps the authors' convention: a speculative request
    whose first token (the prefill's) is a stop token still runs and records one round, so it keeps
    its place in the acceptance length tau. So tau counts exactly the rounds that ran
    (docs/engine-tests.md, "The last-round rule")."""
    if emitted >= max_new_tokens:
        return False
    if stopped:
        return speculative and rounds_ran == 0
    return True


def drop_final_empty_round(accept_lengths: list[int], max_new_tokens: int | None) -> tuple[list[int], bool]:
    """The authors' acceptance lengths under the last-round rule: their loop runs one more round once
    1 + sum of the earlier rounds' lengths has reached max_new_tokens (all its tokens are cut); that
    round is left out so their per-round figures compare with ours. Returns (lengths, whether one
    was dropped). The prefill's token is the 1."""
    if max_new_tokens is not None and accept_lengths and 1 + sum(accept_lengths[:-1]) >= max_new_tokens:
        return accept_lengths[:-1], True
    return accept_lengths, False


class Proposer(Protocol):
    """Step 1 of a speculative round, behind one method so tests can swap in a rigged proposer.

    propose(ctx, bonus, cache, draft_len, start) -> draft logits [L, V] for depths 1..L, where ctx
    are the target hidden states [start - draft_len, n*H] of positions draft_len .. start-1, the
    bonus token sits at position `start`, and `cache` is the proposer's own cache (`new_cache`)."""

    block_size: int
    target_layer_ids: tuple[int, ...]

    def new_cache(self, capacity: int): ...

    def propose(self, ctx: torch.Tensor, bonus: int, cache, draft_len: int, start: int) -> torch.Tensor: ...


@dataclass(frozen=True)
class WalkLayout:
    """The walk result of one round as one long vector (the only device->host transfer of a GPU round):

        [a | node at depth 0..L | token at depth 0..L | bonus | flag (only when guarded)]

    a = accepted nodes counting the root; depths >= a hold node 0 and the root's token; flag is the
    pruned tree builder's certificate counter (nonzero: the round must be redone). Every producer
    (gpu/tree_ops.walk_static, gpu/kernels/tree_verify.walk_tree) and consumer (the commits, the
    loop) reads the offsets from here."""

    L: int
    guard: bool = False

    COUNT = 0

    @property
    def nodes(self) -> int:
        """Offset of the node index at depth 0 (the root, always 0)."""
        return 1

    @property
    def tokens(self) -> int:
        """Offset of the token at depth 0 (the root's token)."""
        return self.L + 2

    @property
    def bonus(self) -> int:
        return 2 * self.L + 3

    @property
    def flag(self) -> int:
        return 2 * self.L + 4

    @property
    def size(self) -> int:
        """Elements without the flag (what a walk produces) ..."""
        return 2 * self.L + 4

    @property
    def size_guarded(self) -> int:
        """... and with it when guarded (what reaches the host)."""
        return self.size + (1 if self.guard else 0)

    def read(self, res: list[int]) -> "WalkResult":
        a = res[self.COUNT]
        return WalkResult(
            accepted=res[self.nodes : self.nodes + a],
            path_tokens=res[self.tokens + 1 : self.tokens + a],
            bonus=res[self.bonus],
            flagged=bool(self.guard and res[self.flag]),
        )


@dataclass
class WalkResult:
    """One round's walk, read on the host: the accepted nodes (root first), the tokens of the accepted
    non-root nodes, the new bonus token, and whether the tree's certificate failed."""

    accepted: list[int]
    path_tokens: list[int]
    bonus: int
    flagged: bool = False

    @property
    def a(self) -> int:
        return len(self.accepted)

    @property
    def new_tokens(self) -> list[int]:
        """What the round emits: the accepted path minus the root, then the bonus."""
        return self.path_tokens + [self.bonus]


def logit_gaps(logits: torch.Tensor) -> list[float]:
    """Top-1 minus top-2 logit per row (inf when the vocabulary has one entry)."""
    if logits.shape[-1] < 2:
        return [float("inf")] * logits.shape[0]
    top2 = torch.topk(logits.float(), 2, dim=-1).values
    return (top2[:, 0] - top2[:, 1]).tolist()
