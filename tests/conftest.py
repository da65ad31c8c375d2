"""Session-wide fixtures: one real vLLM-CPU AR server and one DFlash server for the whole test session.

Both start at once (~3.1 GB each) the first time a test asks for either, and stop at the end of the
session; tests that need them must not change their state (no restarts, no kills: the sweep tests
launch their own servers). For iterating on the tests, DDTREE_BENCH_VLLM_AR_URL and
DDTREE_BENCH_VLLM_DFLASH_URL point them at servers already running (started the same way).
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def vllm_servers(tmp_path_factory):
    import os
    from types import SimpleNamespace

    from vllm_support import require_vllm, start_vllm

    from process_support import started_together

    given = {m: os.environ.get(f"DDTREE_BENCH_VLLM_{m.upper()}_URL") for m in ("ar", "dflash")}
    if all(given.values()):
        yield {m: SimpleNamespace(url=u.rstrip("/")) for m, u in given.items()}
        return
    py = require_vllm()
    logs = tmp_path_factory.mktemp("vllm-logs")
    with started_together({m: (lambda m=m: start_vllm(m, logs, py)) for m in ("ar", "dflash")}) as servers:
        yield servers


@pytest.fixture(scope="session")
def vllm_ar(vllm_servers):
    return vllm_servers["ar"]


@pytest.fixture(scope="session")
def vllm_dflash(vllm_servers):
    return vllm_servers["dflash"]


@pytest.fixture(scope="session")
def vllm_dflash_url(request):
    """The DFlash server's base URL: DDTREE_BENCH_VLLM_DFLASH_URL when set (on its own: no AR server is
    started for it), else the session's shared server (`vllm_dflash`)."""
    import os

    url = os.environ.get("DDTREE_BENCH_VLLM_DFLASH_URL")
    return url.rstrip("/") if url else request.getfixturevalue("vllm_dflash").url
