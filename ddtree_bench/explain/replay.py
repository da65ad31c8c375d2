"""Re-running a server run's requests on the reference engine, under one drafter variant at a time.

Each request is replayed from the prompt ids the server was sent (records.jsonl `prompt_ids`), with
the run's method, budget, max_new_tokens and stop ids, greedy. The reference keeps its own
drafter and target; a `DraftVariant` swaps in `VariantProposer`, so every variant runs the very
same weights. Knows the engine and records; nothing of HTTP or files on disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ddtree_bench.explain.curves import Acceptance, Key


@dataclass
class ReplayRequest:
    key: Key
    prompt_ids: list[int]
    max_new_tokens: int


@dataclass
class ReplayResult:
    acceptance: Acceptance
    drafted: dict[Key, list[list[int]]]   # per request, per round: the chain drafted (dflash only; else empty)


def replay(engine: Any, requests: list[ReplayRequest], method: str, budget: int, stop_ids: list[int], variant,
           on_request: Callable[[], None] | None = None) -> ReplayResult:
    """Run every request on `engine`'s target and drafter under `variant`; greedy."""
    from ddtree_bench.engine.draft_variants import VariantProposer
    from ddtree_bench.engine.generate import Engine

    proposer = VariantProposer(engine.drafter, engine.target, variant)
    eng = Engine(engine.target, engine.drafter, proposer=proposer, sync_stages=False)
    rounds: dict[Key, list[int]] = {}
    outputs: dict[Key, list[int]] = {}
    drafted: dict[Key, list[list[int]]] = {}
    for r in requests:
        g = eng.generate(r.prompt_ids, method=method, budget=budget, max_new_tokens=r.max_new_tokens,
                         stop_ids=stop_ids, record_trees=method == "dflash")
        rounds[r.key] = list(g.accept_lengths)
        outputs[r.key] = list(g.output_ids)
        drafted[r.key] = [list(t.token_ids) for t in (g.trees or [])]  # a chain's nodes, depth 1 first (no root)
        if on_request is not None:
            on_request()
    return ReplayResult(Acceptance(variant.name, rounds, outputs), drafted)
