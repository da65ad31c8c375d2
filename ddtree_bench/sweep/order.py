"""The order a sweep runs its points in: batches that share a server (or a loaded engine), in rounds.

A batch is a list of points run back to back on one server process (server backends) or one
loaded model pair (in-process). Three orders (`grid.order`, `--order`):

* `as-listed` — the expansion order (`grid.expand`): one batch per server group, its client-side
  points with their repeats back to back. The order of versions before 0.x's repeats rounds.
* `interleaved` (default) — with `repeats` > 1 the points run in rounds: every point once, then
  again, each round in a shuffled order, so a slow minute of the machine is spread over all
  points instead of landing on one. In-process points interleave across all points of their
  engine (model, dtype, device); server points interleave within their server group (one server
  start per group, as before). With one repeat the listed order is kept (nothing to interleave).
* `rounds` — as interleaved, but server groups (and in-process engines) are cycled too: round k
  runs every group's k-th repeat, the groups in a shuffled order, restarting each server once
  per round. Costs a server start per group per round; spreads drift across budgets.

Where two rounds meet, the next round's first point (or server group, for `rounds`) is never the
configuration that just ran: it is swapped with the round's second, so no configuration runs its
two repeats back to back (a slow minute would land on both). Shuffles are `random.Random(f"{seed}:{round}")` — reproducible from the seed recorded in
sweep.json (`grid.order_seed`), so `--resume` recomputes the same schedule and skips the
point-repeats already finished (a point-repeat is the unit of resume).

Knows points and their keys; nothing of servers, engines or files.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass

from ddtree_bench import defaults as D
from ddtree_bench.errors import UsageError
from ddtree_bench.sweep.grid import Point, server_groups


@dataclass
class Batch:
    """Points run back to back on one server / loaded engine (`round` None: every round)."""

    key: tuple
    points: list[Point]
    round: int | None = None


def _shuffled(items: list, seed: int, rnd: int) -> list:
    out = list(items)
    random.Random(f"{seed}:{rnd}").shuffle(out)
    return out


def _config(p: Point) -> Point:
    """The point without its repeat index: what two repeats of one configuration share."""
    return dataclasses.replace(p, repeat=0)


def _not_after(seq: list, last, key: Callable = lambda x: x) -> list:
    """`seq` (one round, every item once) with its first item swapped with its second when it would
    run right after `last`, the same configuration, where two rounds meet."""
    if last is None or len(seq) < 2 or key(seq[0]) != key(last):
        return seq
    seq = list(seq)
    seq[0], seq[1] = seq[1], seq[0]
    return seq


def _batch_key(p: Point) -> tuple:
    """In-process points of one engine share a batch; server points share their server's."""
    return ("inprocess",) + p.engine_key() if p.backend == "inprocess" else p.server_key()


def _groups(points: list[Point], key: Callable[[Point], tuple]) -> dict[tuple, list[Point]]:
    out: dict[tuple, list[Point]] = {}
    for p in points:
        out.setdefault(key(p), []).append(p)
    return out


def schedule(points: list[Point], order: str = D.SWEEP_ORDER, seed: int | None = None) -> list[Batch]:
    """The batches of `points` in execution order (module docstring). `seed` is needed to shuffle."""
    if order not in D.SWEEP_ORDERS:
        raise UsageError(f"unknown order {order!r}; expected one of {', '.join(D.SWEEP_ORDERS)}")
    repeats = max((p.repeat for p in points), default=0) + 1
    if order == "as-listed" or repeats == 1:
        return [Batch(k, g) for k, g in server_groups(points)]
    if seed is None:
        raise ValueError("an interleaved schedule needs a seed")
    batches = _groups(points, _batch_key)
    if order == "interleaved":
        out = []
        for key, group in batches.items():
            seq: list[Point] = []
            for k in range(repeats):
                seq += _not_after(_shuffled([p for p in group if p.repeat == k], seed, k), seq[-1] if seq else None, _config)
            out.append(Batch(key, seq))
        return out
    out: list[Batch] = []
    for k in range(repeats):
        keys = _not_after(_shuffled(list(batches), seed, k), out[-1].key if out else None)
        for key in keys:
            last = out[-1].points[-1] if out else None
            pts = _not_after(_shuffled([p for p in batches[key] if p.repeat == k], seed, k), last, _config)
            if pts:
                out.append(Batch(key, pts, k))
    return out


def describe(batches: list[Batch], order: str, seed: int | None) -> dict:
    """sweep.json's `schedule`: the order, the seed and the point ids of every batch in run order."""
    return {"order": order, "seed": seed, "batches": [[p.id for p in b.points] for b in batches]}


def fix_seed(grid) -> None:
    """Draw the shuffle seed of a new sweep (when the grid gives none), so sweep.json records it."""
    if getattr(grid, "order_seed", None) is None:
        import secrets

        grid.order_seed = secrets.randbelow(2**31)


def effective_order(grid, points: list[Point]) -> str:
    """The grid's order; a sweep stored without a seed (made before interleaving existed) keeps the
    order it was made with: as listed."""
    order = getattr(grid, "order", D.SWEEP_ORDER) or D.SWEEP_ORDER
    if getattr(grid, "order_seed", None) is None and order != "as-listed" and max((p.repeat for p in points), default=0) > 0:
        return "as-listed"
    return order


def schedule_for(grid, points: list[Point]) -> list[Batch]:
    """`schedule` with the grid's (effective) order and seed."""
    return schedule(points, effective_order(grid, points), getattr(grid, "order_seed", None))


def describe_for(grid, points: list[Point]) -> dict:
    return describe(schedule_for(grid, points), effective_order(grid, points), getattr(grid, "order_seed", None))
