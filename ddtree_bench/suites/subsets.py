"""Subset rules: which n items of a benchmark dataset a run uses, in which order.

Two rules reproduce z-lab's scripts, and they pick *different* items, so baselines and run.json
record which one was used:

- `zlab-paper`: the DDTree paper / paper-era DFlash script (`benchmark.py`):
  `dataset.shuffle(seed=0).select(range(n))`, only when the dataset has more than n items.
  Hugging Face `datasets` shuffles with `numpy.random.default_rng(seed).permutation(len(dataset))`
  (`Dataset.shuffle`, datasets 5.2.0), so the selection is that permutation's first n indices;
  `tests/suites/test_suites.py` checks this against `datasets` itself. No `datasets` needed here.
- `zlab-current`: the current `python -m dflash.benchmark`: `random.seed(0)`, then
  `random.shuffle(items)` and the first n, again only when there are more than n items.
  `random.shuffle` depends only on the list's length, so shuffling indices gives the same order.
- `first`: the first n items in file order (custom suites' default).

Both shuffling rules give a prefix-consistent order: the first 10 of a 128 selection are the 10
that `--limit 10` selects. Knows nothing of suites, files or templates.
"""

from __future__ import annotations

import random

from ddtree_bench.errors import UsageError

RULES = ("zlab-paper", "zlab-current", "first")
SEED = 0  # both z-lab scripts shuffle with seed 0


def check_rule(rule: str | None, where: str = "--subset") -> str | None:
    if rule is not None and rule not in RULES:
        raise UsageError(f"unknown {where} {rule!r}; expected one of {', '.join(RULES)}")
    return rule


def select_indices(num_items: int, n: int | None, rule: str | None) -> list[int]:
    """Indices (into the dataset in source order) of the items a run uses, in run order.

    n None, or n >= num_items: every item in source order (neither z-lab script shuffles then).
    rule None behaves like "first".
    """
    check_rule(rule)
    if n is None or n >= num_items:
        return list(range(num_items))
    if n < 0:
        raise UsageError(f"sample count must be >= 0, got {n}")
    if rule == "zlab-paper":
        import numpy as np

        perm = np.random.default_rng(SEED).permutation(num_items)
        return [int(i) for i in perm[:n]]
    if rule == "zlab-current":
        order = list(range(num_items))
        random.Random(SEED).shuffle(order)  # == random.seed(0); random.shuffle(order)
        return order[:n]
    return list(range(n))
