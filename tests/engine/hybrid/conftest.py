"""Fixtures of the hybrid-target tests: one random tiny world (transformers oracle + engine target +
random drafter) per config of hybrid_support.CONFIGS, built once per session; one torch thread."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def hybrid_worlds(tmp_path_factory):
    from hybrid_support import build_world

    root = tmp_path_factory.mktemp("hybrid")
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = build_world(root, name)
        return cache[name]

    return get


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
