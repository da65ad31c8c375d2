"""tests/shard_support.py: N shards of one collection run every test exactly once between them, and
the costly neighbours of one parametrised test land in different shards."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import shard_support


def _shard(items: list[str], spec: str | None) -> tuple[list[str], list[str]]:
    dropped: list[str] = []
    config = SimpleNamespace(getoption=lambda name: spec,
                             hook=SimpleNamespace(pytest_deselected=lambda items: dropped.extend(items)))
    kept = list(items)
    shard_support.pytest_collection_modifyitems(config, kept)
    return kept, dropped


@pytest.mark.parametrize("n", [1, 2, 3])
def test_the_shards_partition_the_collection(n):
    items = [f"t{i}" for i in range(11)]
    kept = []
    for k in range(n):
        mine, dropped = _shard(items, f"{k}/{n}")
        assert sorted(mine + dropped) == sorted(items)    # a shard keeps or deselects every test
        kept += mine
    assert sorted(kept) == sorted(items) and len(kept) == len(items)   # each test in exactly one shard
    assert _shard(items, f"0/{n}")[0][:2] == (["t0", "t1"] if n == 1 else ["t0", f"t{n}"])  # interleaved


def test_no_shard_keeps_everything_and_a_bad_shard_is_a_usage_error():
    assert _shard(["a", "b"], None) == (["a", "b"], [])
    with pytest.raises(pytest.UsageError):
        _shard(["a"], "2/2")
