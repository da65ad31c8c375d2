"""Backends turn a `GenerationRequest` into a `RequestRecord`, all in the same shape.

`make_backend(spec)` picks one by `spec.backend`: `inprocess` (the reference engine in this
process), or an OpenAI-compatible HTTP client for `standalone` (ddtree-bench serve), `sglang`,
`vllm` and `openai` (any other OpenAI-compatible server: standard fields only, token ids from the
server or re-tokenized text; docs/openai-compat.md). Backends know nothing of trees: acceptance
arrives as per-round lengths or engine stats.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ddtree_bench.backends.base import Backend
    from ddtree_bench.run_spec import RunSpec


def make_backend(spec: "RunSpec") -> "Backend":
    if spec.backend == "inprocess":
        from ddtree_bench.backends.inprocess import InProcessBackend

        return InProcessBackend.from_spec(spec)
    from ddtree_bench.backends.client import HTTPBackend  # issue: suites/driver/serve

    return HTTPBackend.from_spec(spec)
