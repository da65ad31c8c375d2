"""A pytest plugin that runs one shard of a test run: `-p shard_support --shard K/N` keeps the collected
tests whose index in collection order is K mod N and deselects the rest, so N processes given
K = 0..N-1 run every test exactly once between them. Interleaved (not blocks of the order) so the
costly cases of one parametrised test spread over the shards.

Loaded with `-p`, before pytest reads its ini `pythonpath`: the child needs tests/ on PYTHONPATH.
tests/engine/gpu/test_triton_interpreter.py uses it to interpret the kernels on both cores. Knows
pytest's collection hooks; nothing of the tests it splits.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="K/N",
                     help="run only the collected tests whose index is K mod N (N processes, K = 0..N-1)")


def shard_of(spec: str) -> tuple[int, int]:
    k, n = (int(x) for x in spec.split("/"))
    if not 0 <= k < n:
        raise pytest.UsageError(f"--shard {spec}: need 0 <= K < N")
    return k, n


@pytest.hookimpl(trylast=True)   # after -m / -k deselection: shard what would run
def pytest_collection_modifyitems(config, items):
    spec = config.getoption("--shard")
    if not spec:
        return
    k, n = shard_of(spec)
    config.hook.pytest_deselected(items=[it for i, it in enumerate(items) if i % n != k])
    items[:] = [it for i, it in enumerate(items) if i % n == k]
